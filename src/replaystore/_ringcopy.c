/* Compiled check-and-copy for replaystore.transitions.ReplayBuffer.add / add_batch.
 *
 * A `Plan` holds the destination columns of one storage (writable, C-contiguous
 * buffers of `capacity` rows each, in RAM or memory-mapped files, acquired once
 * through the buffer protocol: no NumPy headers).
 *
 * `Plan.add_batch(experience, pointer)` and `Plan.add(experience, pointer)`
 * take a plain dict of key -> value and either write it or decline it:
 *
 *   - they accept only values that need no conversion: instances of the
 *     plan's array types (NumPy arrays and NumPy scalars) exporting a
 *     C-contiguous buffer with exactly the column's format and item size and
 *     the column's item shape (add_batch: the same leading N for every key),
 *     and, for `add`, Python floats, ints and bools into columns of item shape
 *     () whose kind takes them without a cast across kinds or an overflow;
 *   - every value is checked before any byte is written, so a declined
 *     experience leaves the columns untouched;
 *   - every other buffer exporter (bytes, bytearray, memoryview, array.array,
 *     ...) is declined, so the Python side alone decides what such a value
 *     means: one rule for both paths (it refuses bytes, bytearray and str);
 *   - they return the number of rows written (add_batch: N, which may be 0 or
 *     larger than the capacity: the newest `capacity` rows are kept, wrapping
 *     around the end of the ring; add: 1), or -1 when they decline. The Python
 *     side then takes its own path, which converts what may be converted
 *     (lists, tensors, casts) or raises the SchemaError naming the key.
 *
 * They raise only for a bad pointer (a bug on the Python side). What they
 * write is byte for byte what NumPy's assignment writes: same-format copies are
 * memcpy, and the scalar conversions are the C casts NumPy uses (a float that
 * overflows float32 is declined: NumPy warns about it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define STACK_COLUMNS 16
#define RELEASE_GIL_BYTES (1 << 16) /* copies larger than this run without the GIL */

/* Scalar kinds of a column, from its buffer format. */
enum { K_OTHER, K_BOOL, K_INT, K_UINT, K_FLOAT };

typedef struct {
    PyObject *name;  /* interned str */
    Py_buffer dest;  /* the whole column, capacity rows */
    char format[16]; /* format without a native-order prefix */
    Py_ssize_t itemsize, rowbytes;
    int kind;
} column;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ncols, capacity;
    column *cols;
    PyObject *array_types; /* tuple of types whose buffers may be copied */
} Plan;

static const char *
strip_order(const char *fmt)
{
    if (fmt == NULL) return "B";
    if (fmt[0] == '@') return fmt + 1;
    return fmt;
}

static int
format_kind(const char *fmt, Py_ssize_t itemsize)
{
    if (fmt[0] == '\0' || fmt[1] != '\0') return K_OTHER;
    switch (fmt[0]) {
    case '?':
        return itemsize == 1 ? K_BOOL : K_OTHER;
    case 'b': case 'h': case 'i': case 'l': case 'q':
        return K_INT;
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        return K_UINT;
    case 'f':
        return itemsize == 4 ? K_FLOAT : K_OTHER;
    case 'd':
        return itemsize == 8 ? K_FLOAT : K_OTHER;
    default:
        return K_OTHER;
    }
}

static void
plan_clear_columns(Plan *self)
{
    if (self->cols == NULL) return;
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Py_XDECREF(self->cols[i].name);
        if (self->cols[i].dest.obj) PyBuffer_Release(&self->cols[i].dest);
    }
    PyMem_Free(self->cols);
    self->cols = NULL;
    self->ncols = 0;
}

static void
plan_dealloc(Plan *self)
{
    plan_clear_columns(self);
    Py_CLEAR(self->array_types);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Plan(names, columns, capacity, array_types)
 *
 * names: tuple of str; columns: tuple of writable C-contiguous buffers of shape
 * (capacity, *item_shape), in the same order; array_types: tuple of the types
 * (and their subclasses) whose buffers add/add_batch may copy.
 */
static int
plan_init(Plan *self, PyObject *args, PyObject *kwds)
{
    PyObject *names, *columns, *array_types;
    Py_ssize_t capacity;
    static char *kwlist[] = {"names", "columns", "capacity", "array_types", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!nO!", kwlist, &PyTuple_Type, &names,
                                     &PyTuple_Type, &columns, &capacity, &PyTuple_Type,
                                     &array_types)) {
        return -1;
    }
    plan_clear_columns(self);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(array_types); i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(array_types, i))) {
            PyErr_SetString(PyExc_TypeError, "_ringcopy.Plan: array_types must be types");
            return -1;
        }
    }
    Py_INCREF(array_types);
    Py_XSETREF(self->array_types, array_types);
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(columns) != n || capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "_ringcopy.Plan: inconsistent arguments");
        return -1;
    }
    self->cols = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(column));
    if (self->cols == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->ncols = n;
    self->capacity = capacity;
    for (Py_ssize_t i = 0; i < n; i++) {
        column *c = &self->cols[i];
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(name)) {
            PyErr_SetString(PyExc_TypeError, "_ringcopy.Plan: names must be str");
            goto fail;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        c->name = name;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, i), &c->dest,
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
            goto fail;
        }
        const char *fmt = strip_order(c->dest.format);
        if (strlen(fmt) >= sizeof(c->format) || c->dest.ndim < 1 || c->dest.shape == NULL ||
            c->dest.shape[0] != capacity || c->dest.itemsize < 1) {
            PyErr_SetString(PyExc_ValueError,
                            "_ringcopy.Plan: a column is not a (capacity, ...) array");
            goto fail;
        }
        strcpy(c->format, fmt);
        c->itemsize = c->dest.itemsize;
        c->rowbytes = c->dest.len / capacity;
        c->kind = format_kind(c->format, c->itemsize);
    }
    return 0;
fail: /* a half-built plan is never left usable */
    plan_clear_columns(self);
    return -1;
}

/* Does `src` (a buffer acquired with ndim/shape/format) hold items of column c,
 * with `lead` leading dimensions (0: one item, 1: a batch)? */
static int
matches(const column *c, const Py_buffer *src, int lead)
{
    int item_ndim = c->dest.ndim - 1;
    if (src->ndim != item_ndim + lead || src->itemsize != c->itemsize) return 0;
    if (strcmp(strip_order(src->format), c->format) != 0) return 0;
    for (int d = 0; d < item_ndim; d++) {
        if (src->shape[lead + d] != c->dest.shape[1 + d]) return 0;
    }
    return 1;
}

/* Copy `rows` rows from `src` to ring row `row` of column c (memmove: a source
 * may even be a view of the column itself). */
static void
put_rows(const column *c, Py_ssize_t row, const char *src, Py_ssize_t rows)
{
    if (rows > 0 && c->rowbytes > 0) {
        memmove((char *)c->dest.buf + row * c->rowbytes, src, (size_t)(rows * c->rowbytes));
    }
}

static void
release_all(Py_buffer *views, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (views[i].obj) PyBuffer_Release(&views[i]);
    }
}

static int
parse_pointer(Plan *self, PyObject *o_ptr, Py_ssize_t *ptr)
{
    *ptr = PyLong_AsSsize_t(o_ptr);
    if (*ptr == -1 && PyErr_Occurred()) return -1;
    if (*ptr < 0 || *ptr >= self->capacity || self->cols == NULL) {
        PyErr_SetString(PyExc_ValueError, "_ringcopy: pointer outside the ring (or no plan)");
        return -1;
    }
    return 0;
}

/* Is v an instance of one of the plan's array types (whose buffers we copy)? */
static int
is_array(const Plan *self, PyObject *v)
{
    Py_ssize_t n = PyTuple_GET_SIZE(self->array_types);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_TypeCheck(v, (PyTypeObject *)PyTuple_GET_ITEM(self->array_types, i))) {
            return 1;
        }
    }
    return 0;
}

/* Look up column i's value in exp; NULL (no error set) when missing. */
static PyObject *
lookup(PyObject *exp, const column *c)
{
    PyObject *v = PyDict_GetItemWithError(exp, c->name);
    if (v == NULL) PyErr_Clear();
    return v;
}

static PyObject *
plan_add_batch(Plan *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add_batch(experience, pointer)");
        return NULL;
    }
    PyObject *exp = args[0];
    Py_ssize_t ptr;
    if (parse_pointer(self, args[1], &ptr) < 0) return NULL;
    Py_ssize_t ncols = self->ncols;
    if (!PyDict_CheckExact(exp) || PyDict_GET_SIZE(exp) != ncols) return PyLong_FromLong(-1);

    Py_buffer stack_views[STACK_COLUMNS];
    Py_buffer *views = stack_views;
    if (ncols > STACK_COLUMNS) {
        views = PyMem_Calloc((size_t)ncols, sizeof(Py_buffer));
        if (views == NULL) return PyErr_NoMemory();
    }
    else {
        memset(stack_views, 0, sizeof(stack_views));
    }
    Py_ssize_t acquired = 0, n = -1;
    int ok = 1;
    /* Check every column before writing any. */
    for (Py_ssize_t i = 0; ok && i < ncols; i++) {
        const column *c = &self->cols[i];
        PyObject *v = lookup(exp, c);
        if (v == NULL || !is_array(self, v) || !PyObject_CheckBuffer(v)) {
            ok = 0;
            break;
        }
        if (PyObject_GetBuffer(v, &views[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        acquired = i + 1;
        if (!matches(c, &views[i], 1)) {
            ok = 0;
            break;
        }
        if (i == 0) n = views[i].shape[0];
        ok = views[i].shape[0] == n && views[i].len == n * c->rowbytes;
    }
    PyObject *result = NULL;
    if (!ok) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    Py_ssize_t cap = self->capacity;
    Py_ssize_t m = n < cap ? n : cap;       /* rows kept: the newest m */
    Py_ssize_t start = (ptr + (n - m)) % cap; /* where the first kept row goes */
    Py_ssize_t first = m < cap - start ? m : cap - start;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < ncols; i++) total += m * self->cols[i].rowbytes;
    /* Like NumPy, large copies let other threads run (the buffer's lock is held). */
    PyThreadState *ts = total > RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        const column *c = &self->cols[i];
        const char *src = (const char *)views[i].buf + (n - m) * c->rowbytes;
        put_rows(c, start, src, first);
        put_rows(c, 0, src + first * c->rowbytes, m - first);
    }
    if (ts) PyEval_RestoreThread(ts);
    result = PyLong_FromSsize_t(n);
done:
    release_all(views, acquired);
    if (views != stack_views) PyMem_Free(views);
    return result;
}

/* A Python scalar for column c (item shape ()), converted as NumPy would into
 * `out`; 0 when it is not one we convert here (the Python side will). */
static int
convert_scalar(const column *c, PyObject *v, char *out)
{
    if (c->dest.ndim != 1) return 0;
    if (PyFloat_CheckExact(v)) {
        if (c->kind != K_FLOAT) return 0;
        double d = PyFloat_AS_DOUBLE(v);
        if (c->itemsize == 8) {
            memcpy(out, &d, 8);
            return 1;
        }
        float f = (float)d;
        if (isinf(f) && !isinf(d)) return 0; /* NumPy warns about the overflow */
        memcpy(out, &f, 4);
        return 1;
    }
    long long x;
    if (PyBool_Check(v)) {
        if (c->kind != K_BOOL && c->kind != K_INT && c->kind != K_UINT) return 0;
        x = v == Py_True;
    }
    else if (PyLong_CheckExact(v)) {
        if (c->kind != K_INT && c->kind != K_UINT) return 0;
        int overflow = 0;
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (c->kind == K_UINT && x < 0) return 0;
        if (c->itemsize < 8) {
            int bits = (int)c->itemsize * 8 - (c->kind == K_INT);
            long long hi = (1LL << bits) - 1, lo = c->kind == K_INT ? -hi - 1 : 0;
            if (x < lo || x > hi) return 0;
        }
    }
    else {
        return 0;
    }
    switch (c->itemsize) {
    case 1: { int8_t y = (int8_t)x; memcpy(out, &y, 1); return 1; }
    case 2: { int16_t y = (int16_t)x; memcpy(out, &y, 2); return 1; }
    case 4: { int32_t y = (int32_t)x; memcpy(out, &y, 4); return 1; }
    case 8: { int64_t y = (int64_t)x; memcpy(out, &y, 8); return 1; }
    default: return 0;
    }
}

static PyObject *
plan_add(Plan *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(experience, pointer)");
        return NULL;
    }
    PyObject *exp = args[0];
    Py_ssize_t ptr;
    if (parse_pointer(self, args[1], &ptr) < 0) return NULL;
    Py_ssize_t ncols = self->ncols;
    if (!PyDict_CheckExact(exp) || PyDict_GET_SIZE(exp) != ncols) return PyLong_FromLong(-1);

    Py_buffer stack_views[STACK_COLUMNS];
    char stack_scalars[STACK_COLUMNS][8];
    Py_buffer *views = stack_views;
    char(*scalars)[8] = stack_scalars;
    if (ncols > STACK_COLUMNS) {
        views = PyMem_Calloc((size_t)ncols, sizeof(Py_buffer));
        scalars = PyMem_Calloc((size_t)ncols, 8);
        if (views == NULL || scalars == NULL) {
            PyMem_Free(views);
            PyMem_Free(scalars);
            return PyErr_NoMemory();
        }
    }
    else {
        memset(stack_views, 0, sizeof(stack_views));
    }
    Py_ssize_t acquired = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < ncols; i++) {
        const column *c = &self->cols[i];
        PyObject *v = lookup(exp, c);
        if (v == NULL) {
            ok = 0;
        }
        else if (is_array(self, v)) {
            if (PyObject_GetBuffer(v, &views[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
                PyErr_Clear();
                ok = 0;
            }
            else {
                acquired = i + 1;
                ok = matches(c, &views[i], 0) && views[i].len == c->rowbytes;
            }
        }
        else {
            ok = convert_scalar(c, v, scalars[i]);
        }
    }
    PyObject *result = NULL;
    if (!ok) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        const column *c = &self->cols[i];
        put_rows(c, ptr, views[i].obj ? (const char *)views[i].buf : scalars[i], 1);
    }
    result = PyLong_FromLong(1);
done:
    release_all(views, acquired);
    if (views != stack_views) {
        PyMem_Free(views);
        PyMem_Free(scalars);
    }
    return result;
}

static PyMethodDef plan_methods[] = {
    {"add_batch", (PyCFunction)(void (*)(void))plan_add_batch, METH_FASTCALL,
     "add_batch(experience: dict, pointer: int) -> int: rows written (N), or -1 (declined, "
     "nothing written)"},
    {"add", (PyCFunction)(void (*)(void))plan_add, METH_FASTCALL,
     "add(experience: dict, pointer: int) -> int: 1 (written) or -1 (declined, nothing "
     "written)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore._ringcopy.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(names, columns, capacity, array_types): checked row copies "
              "into the columns of one transition storage (see replaystore/_ringcopy.c).",
    .tp_methods = plan_methods,
    .tp_init = (initproc)plan_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef ringcopy_module = {
    PyModuleDef_HEAD_INIT,
    "_ringcopy",
    "Compiled check-and-copy for the transition buffer's add and add_batch (see buffer.py).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__ringcopy(void)
{
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&ringcopy_module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
