/* Compiled kernel of replaystore.transitions.nstep: the n-step window of each sample.
 *
 *   plan = Plan(flags, reward, powers, next_src, term_flag)
 *   plan.window(t, pointer, ret, next_out, done, discount, term) -> None
 *
 * A Plan holds the columns a buffer's n-step entries read (made once per
 * storage, so a sample only hands over its positions and outputs): flags, a
 * tuple of 1 to 3 uint8/bool[cap] arrays (the done, terminated and truncated
 * columns; non-zero is true); reward, float32[cap] or float64[cap]; powers,
 * float64[n + 1] (gamma ** k, which sets n); next_src, any C-contiguous array of
 * cap rows (the next_obs column); term_flag, the index of the terminated column
 * in flags or -1. It keeps their buffers until it is freed.
 *
 * window: for each sampled storage position t[b] walks k = 0, 1, ... over the
 * positions t + k (wrapping at cap), adding powers[k] * reward[pos] in the
 * reward's precision and in k order (the NumPy path's products and its sum over
 * k, so both give the same values), and stops at the first k where an end flag
 * is set, where pos is the newest stored row (pointer - 1, modulo cap), or at
 * k = n - 1. Then ret[b] = the sum; row b of next_out = row pos of next_src
 * (copied byte for byte); done[b] = an end flag is set at pos; discount[b] =
 * (float)powers[k + 1]; and, unless term is None, term[b] = the terminated flag
 * at pos. t is int64[B]; ret has the reward's dtype, done and term are
 * uint8/bool, discount float32, each [B]; next_out has B rows of next_src's row
 * size. All 1-d and C-contiguous (next_out any shape), of these exact types,
 * else TypeError / ValueError. Every t[b] must be in [0, cap) (ValueError names
 * the first that is not). The loop runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int
get_buffer(PyObject *obj, Py_buffer *view, char format, Py_ssize_t itemsize, int writable,
           const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '=' || f[0] == '<' || f[0] == '@')
        f++;
    int ok = view->itemsize == itemsize && view->ndim == 1 && f[1] == '\0';
    if (ok) {
        if (format == 'q') /* int64 is 'l' or 'q' depending on the platform */
            ok = f[0] == 'q' || (f[0] == 'l' && sizeof(long) == 8);
        else if (format == 'B') /* one byte: uint8 or bool */
            ok = f[0] == 'B' || f[0] == '?';
        else
            ok = f[0] == format;
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-d contiguous array of %s", name,
                     format == 'd'   ? "float64"
                     : format == 'f' ? "float32"
                     : format == 'q' ? "int64"
                                     : "uint8 or bool");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

#define MAX_FLAGS 3

/* memcpy of one next_obs row; fixed sizes let the compiler inline the usual small ones. */
static inline void
copy_row(char *dst, const char *src, Py_ssize_t size)
{
    switch (size) {
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    case 16: memcpy(dst, src, 16); break;
    case 32: memcpy(dst, src, 32); break;
    default: memcpy(dst, src, (size_t)size);
    }
}

typedef struct {
    PyObject_HEAD
    Py_buffer flags[MAX_FLAGS];
    Py_ssize_t nflags;
    Py_buffer reward, powers, next_src;
    int has_reward, has_powers, has_next_src;
    int is_double;
    Py_ssize_t n, cap, row_bytes, term_flag;
} Plan;

static void
plan_dealloc(Plan *self)
{
    for (Py_ssize_t i = 0; i < self->nflags; i++)
        PyBuffer_Release(&self->flags[i]);
    if (self->has_reward)
        PyBuffer_Release(&self->reward);
    if (self->has_powers)
        PyBuffer_Release(&self->powers);
    if (self->has_next_src)
        PyBuffer_Release(&self->next_src);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *flagso, *rewardo, *powerso, *srco;
    Py_ssize_t term_flag;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "Plan takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OOOn", &PyTuple_Type, &flagso, &rewardo, &powerso, &srco,
                          &term_flag))
        return NULL;
    Py_ssize_t nflags = PyTuple_GET_SIZE(flagso);
    if (nflags < 1 || nflags > MAX_FLAGS || term_flag < -1 || term_flag >= nflags) {
        PyErr_SetString(PyExc_ValueError,
                        "Plan needs 1 to 3 flag arrays and term_flag -1 or an index of them");
        return NULL;
    }
    Plan *self = (Plan *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->term_flag = term_flag;
    for (Py_ssize_t i = 0; i < nflags; i++) {
        if (get_buffer(PyTuple_GET_ITEM(flagso, i), &self->flags[i], 'B', 1, 0, "flags") < 0)
            goto fail;
        self->nflags = i + 1;
    }
    Py_buffer probe; /* the reward's precision decides the sum's and ret's */
    if (PyObject_GetBuffer(rewardo, &probe, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    self->is_double = probe.itemsize == 8;
    PyBuffer_Release(&probe);
    if (get_buffer(rewardo, &self->reward, self->is_double ? 'd' : 'f', self->is_double ? 8 : 4,
                   0, "reward") < 0)
        goto fail;
    self->has_reward = 1;
    if (get_buffer(powerso, &self->powers, 'd', 8, 0, "powers") < 0)
        goto fail;
    self->has_powers = 1;
    if (PyObject_GetBuffer(srco, &self->next_src, PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    self->has_next_src = 1;
    self->cap = self->flags[0].shape[0];
    self->n = self->powers.shape[0] - 1;
    int ok = self->cap > 0 && self->n >= 1 && self->reward.shape[0] == self->cap &&
             self->next_src.len % self->cap == 0;
    for (Py_ssize_t i = 1; i < nflags; i++)
        ok = ok && self->flags[i].shape[0] == self->cap;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "Plan: flags, reward and next_src need the same cap > 0 rows, and "
                        "powers at least 2 values");
        goto fail;
    }
    self->row_bytes = self->next_src.len / self->cap;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

enum { B_T, B_RET, B_NEXT_OUT, B_DONE, B_DISCOUNT, B_TERM, B_COUNT };

static PyObject *
plan_window(Plan *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "window takes 7 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t pointer = PyLong_AsSsize_t(args[1]);
    if (pointer == -1 && PyErr_Occurred())
        return NULL;
    PyObject *termo = args[6];
    int has_term = termo != Py_None;
    if (has_term && self->term_flag < 0) {
        PyErr_SetString(PyExc_ValueError, "window: term given but the plan has no terminated flag");
        return NULL;
    }
    Py_buffer views[B_COUNT];
    int got[B_COUNT] = {0};
    PyObject *result = NULL;
    Py_ssize_t bad = -1;
    const int dbl = self->is_double;

    if (get_buffer(args[0], &views[B_T], 'q', 8, 0, "t") < 0)
        goto done;
    got[B_T] = 1;
    if (get_buffer(args[2], &views[B_RET], dbl ? 'd' : 'f', dbl ? 8 : 4, 1, "ret") < 0)
        goto done;
    got[B_RET] = 1;
    if (PyObject_GetBuffer(args[3], &views[B_NEXT_OUT], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    got[B_NEXT_OUT] = 1;
    if (get_buffer(args[4], &views[B_DONE], 'B', 1, 1, "done") < 0)
        goto done;
    got[B_DONE] = 1;
    if (get_buffer(args[5], &views[B_DISCOUNT], 'f', 4, 1, "discount") < 0)
        goto done;
    got[B_DISCOUNT] = 1;
    if (has_term) {
        if (get_buffer(termo, &views[B_TERM], 'B', 1, 1, "term") < 0)
            goto done;
        got[B_TERM] = 1;
    }
    const Py_ssize_t rows = views[B_T].shape[0], cap = self->cap, n = self->n;
    if (!(views[B_RET].shape[0] == rows && views[B_DONE].shape[0] == rows &&
          views[B_DISCOUNT].shape[0] == rows && (!has_term || views[B_TERM].shape[0] == rows) &&
          views[B_NEXT_OUT].len == self->row_bytes * rows && pointer >= 0 && pointer < cap)) {
        PyErr_SetString(PyExc_ValueError,
                        "window: the outputs need len(t) rows, and 0 <= pointer < cap");
        goto done;
    }

    const int64_t *tp = (const int64_t *)views[B_T].buf;
    const double *pw = (const double *)self->powers.buf;
    const Py_ssize_t nflags = self->nflags, row_bytes = self->row_bytes;
    const uint8_t *fl[MAX_FLAGS] = {NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < nflags; i++)
        fl[i] = (const uint8_t *)self->flags[i].buf;
    const char *srcp = (const char *)self->next_src.buf;
    char *outp = (char *)views[B_NEXT_OUT].buf;
    uint8_t *donep = (uint8_t *)views[B_DONE].buf;
    float *discp = (float *)views[B_DISCOUNT].buf;
    uint8_t *termp = has_term ? (uint8_t *)views[B_TERM].buf : NULL;
    const uint8_t *termflags = has_term ? fl[self->term_flag] : NULL;
    const double *rd = (const double *)self->reward.buf;
    const float *rf = (const float *)self->reward.buf;
    double *retd = (double *)views[B_RET].buf;
    float *retf = (float *)views[B_RET].buf;
    const int64_t newest = pointer == 0 ? cap - 1 : pointer - 1;

    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < rows; b++) {
        int64_t pos = tp[b];
        if (pos < 0 || pos >= cap) {
            bad = b;
            break;
        }
        Py_ssize_t k = 0;
        int ended = 0;
        double accd = 0.0;
        float accf = 0.0f;
        for (;;) {
            if (dbl)
                accd += pw[k] * rd[pos];
            else
                accf += (float)pw[k] * rf[pos];
            ended = fl[0][pos] != 0;
            for (Py_ssize_t i = 1; i < nflags; i++)
                ended |= fl[i][pos] != 0;
            if (ended || pos == newest || k == n - 1)
                break;
            k++;
            pos = pos + 1 == cap ? 0 : pos + 1;
        }
        if (dbl)
            retd[b] = accd;
        else
            retf[b] = accf;
        copy_row(outp + b * row_bytes, srcp + pos * row_bytes, row_bytes);
        donep[b] = (uint8_t)ended;
        discp[b] = (float)pw[k + 1];
        if (termp)
            termp[b] = termflags[pos] != 0;
    }
    Py_END_ALLOW_THREADS

    if (bad >= 0)
        PyErr_Format(PyExc_ValueError, "t[%zd] = %lld is outside [0, %zd)", bad,
                     (long long)tp[bad], cap);
    else
        result = Py_NewRef(Py_None);

done:
    for (int i = 0; i < B_COUNT; i++)
        if (got[i])
            PyBuffer_Release(&views[i]);
    return result;
}

static PyMethodDef plan_methods[] = {
    {"window", (PyCFunction)(void (*)(void))plan_window, METH_FASTCALL,
     "window(t, pointer, ret, next_out, done, discount, term) -> None: the n-step window "
     "of each position t (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore._nstep.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(flags, reward, powers, next_src, term_flag): the columns n-step "
              "windows read, held for window() calls.",
    .tp_methods = plan_methods,
    .tp_new = plan_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._nstep",
    "Compiled kernel of replaystore.transitions.nstep's n-step windows.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__nstep(void)
{
    if (PyType_Ready(&PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
