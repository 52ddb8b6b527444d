/* Compiled snapshot of plain JSON values, for the in-memory experience storage.
 *
 * copy(value) returns a deep copy of `value` that equals what
 * json.loads(json.dumps(value)) returns (with replaystore's encoder: no NaN or
 * infinity, valid Unicode only), or NotImplemented when it cannot promise that,
 * so the caller takes the JSON path, which either encodes the value or raises
 * the error that names what is wrong. Only the exact types JSON decodes to are
 * taken:
 *
 *   - None, True, False, 64-bit int and finite float: the same (immutable)
 *     object (a larger int declines: Python's int-to-text limit may apply);
 *   - str: the same object, when it holds no lone surrogate (UTF-8 has none);
 *   - list and tuple: a new list of copies (JSON has no tuples);
 *   - dict with str keys: a new dict of copies, in the same order.
 *
 * Everything else declines: subclasses, non-finite floats, dict keys that are
 * not str (JSON turns them into strings), dataclasses, pydantic models, NumPy
 * values, and nesting deeper than MAX_DEPTH (where the JSON path decides between
 * a deep value and a cycle). Mutable containers are always new, so later changes
 * to the caller's objects never reach the copy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define MAX_DEPTH 100

/* 1: no lone surrogate; 0: has one. */
static int
valid_unicode(PyObject *s)
{
    if (PyUnicode_IS_ASCII(s))
        return 1;
    int kind = PyUnicode_KIND(s);
    if (kind == PyUnicode_1BYTE_KIND)
        return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *p = PyUnicode_2BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++)
            if (p[i] >= 0xD800 && p[i] <= 0xDFFF)
                return 0;
        return 1;
    }
    const Py_UCS4 *p = PyUnicode_4BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] >= 0xD800 && p[i] <= 0xDFFF)
            return 0;
    return 1;
}

/* New reference to the copy; Py_NotImplemented (new reference) to decline; NULL on error. */
static PyObject *
copy_value(PyObject *v, int depth)
{
    PyTypeObject *t = Py_TYPE(v);
    if (v == Py_None || v == Py_True || v == Py_False) {
        Py_INCREF(v);
        return v;
    }
    if (t == &PyLong_Type) {
        int overflow;
        PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            Py_RETURN_NOTIMPLEMENTED;
        Py_INCREF(v);
        return v;
    }
    if (t == &PyFloat_Type) {
        if (!isfinite(PyFloat_AS_DOUBLE(v)))
            Py_RETURN_NOTIMPLEMENTED;
        Py_INCREF(v);
        return v;
    }
    if (t == &PyUnicode_Type) {
        if (!valid_unicode(v))
            Py_RETURN_NOTIMPLEMENTED;
        Py_INCREF(v);
        return v;
    }
    if (depth >= MAX_DEPTH)
        Py_RETURN_NOTIMPLEMENTED;
    if (t == &PyList_Type || t == &PyTuple_Type) {
        /* No Python code runs while copying (exact built-in types only), so
         * the container cannot change under the loop. */
        Py_ssize_t n = t == &PyList_Type ? PyList_GET_SIZE(v) : PyTuple_GET_SIZE(v);
        PyObject *out = PyList_New(n);
        if (out == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = t == &PyList_Type ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
            PyObject *c = copy_value(item, depth + 1);
            if (c == NULL || c == Py_NotImplemented) {
                Py_DECREF(out);
                return c;
            }
            PyList_SET_ITEM(out, i, c);
        }
        return out;
    }
    if (t == &PyDict_Type) {
        PyObject *out = PyDict_New();
        if (out == NULL)
            return NULL;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(v, &pos, &key, &value)) {
            if (Py_TYPE(key) != &PyUnicode_Type || !valid_unicode(key)) {
                Py_DECREF(out);
                Py_RETURN_NOTIMPLEMENTED;
            }
            PyObject *c = copy_value(value, depth + 1);
            if (c == NULL || c == Py_NotImplemented) {
                Py_DECREF(out);
                return c;
            }
            int rc = PyDict_SetItem(out, key, c);
            Py_DECREF(c);
            if (rc < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        return out;
    }
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *
jsoncopy_copy(PyObject *self, PyObject *value)
{
    return copy_value(value, 0);
}

static PyMethodDef methods[] = {
    {"copy", jsoncopy_copy, METH_O,
     "copy(value) -> deep copy equal to json.loads(json.dumps(value)), or NotImplemented."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._jsoncopy",
    "Compiled snapshot of plain JSON values (in-memory experience storage).", -1, methods,
};

PyMODINIT_FUNC
PyInit__jsoncopy(void)
{
    return PyModule_Create(&module);
}
