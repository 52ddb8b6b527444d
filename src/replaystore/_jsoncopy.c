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
 *
 * copy_fields(obj, cls, names) returns a new instance of `cls` (made by its
 * tp_alloc, no __init__: for slots classes) whose attributes `names` are
 * copy(getattr(obj, name)), or NotImplemented when one of them declines.
 *
 * copy_checked(obj, cls, spec) is copy_fields for flat records: spec is a
 * tuple of (name, kind) pairs, kind "s" (an ASCII str), "S" (an ASCII str or
 * None), "i" (an int of 64 bits, not bool) or "f" (a finite float); the values
 * are taken as they are (all immutable) when every one has exactly that type,
 * else NotImplemented (the caller's own checks then convert or refuse them).
 *
 * The copies are not tracked by the cyclic garbage collector (nor is
 * copy_fields' instance): they hold only immutable values and other such
 * copies, are never changed afterwards, so they can be part of no cycle;
 * a store of a million rows then adds nothing to every full collection.
 * untrack(obj) does the same for an object whose referents (its type aside)
 * are all untracked, and returns whether it did.
 *
 * check_row(row, row_cls, meta_cls, exp_cls, spec) is copy_checked's test
 * without the copy, for a whole row (see its definition).
 *
 * dumps(value) returns the JSON text of `value`, character for character what
 * replaystore's encoder (json, separators (",", ":"), ensure_ascii=False,
 * allow_nan=False) writes, for the same values copy() takes (a str holding
 * non-ASCII characters is taken too, written raw as that encoder does), or
 * NotImplemented for everything else, so the caller takes the json path.
 *
 * dumps_encoders(value, encoders) is dumps that also writes a value whose exact
 * type is a key of the dict `encoders`: a tuple of field names (a dataclass:
 * an object of those attributes), an object with to_json(value) -> bytes
 * (a pydantic model's serialiser: its JSON written as it is; a ValueError from
 * it declines), or a list [field names, serialiser, heads] (a pydantic model
 * whose JSON is its fields' values, see experience/plain_models.py: the fields
 * read from its __dict__ and written after their heads, '{"name":' then
 * ',"name":', or, when one of them declines, the serialiser's JSON). A type
 * mapped to None, or absent, declines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

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

static int
visit_tracked(PyObject *child, void *arg)
{
    void **a = (void **)arg;
    if (child != (PyObject *)a[0] && PyObject_GC_IsTracked(child)) {
        *(int *)a[1] = 1;
        return 1;
    }
    return 0;
}

/* Untrack `obj` when none of its referents but its type is tracked: 1 done, 0 not. */
static int
untrack_if_leaves(PyObject *obj)
{
    if (!PyObject_GC_IsTracked(obj))
        return 1;
    traverseproc traverse = Py_TYPE(obj)->tp_traverse;
    if (traverse == NULL)
        return 0;
    int found = 0;
    void *arg[2] = {(void *)Py_TYPE(obj), &found};
    traverse(obj, visit_tracked, arg);
    if (found)
        return 0;
    PyObject_GC_UnTrack(obj);
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
        untrack_if_leaves(out);
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
        untrack_if_leaves(out); /* inserting a list tracks a dict */
        return out;
    }
    Py_RETURN_NOTIMPLEMENTED;
}


typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} sbuf;

static int
sb_reserve(sbuf *b, Py_ssize_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap * 2;
    if (cap < b->len + extra)
        cap = b->len + extra;
    char *p = PyMem_Realloc(b->buf, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->buf = p;
    b->cap = cap;
    return 0;
}

static int
sb_put(sbuf *b, const char *s, Py_ssize_t n)
{
    if (sb_reserve(b, n) < 0)
        return -1;
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    return 0;
}

/* A str as a JSON string (UTF-8): escapes as json's encode_basestring. 1: declined. */
static int
put_string(sbuf *b, PyObject *s)
{
    if (!valid_unicode(s))
        return 1;
    Py_ssize_t n;
    const char *p;
    PyObject *tmp = NULL;
    if (PyUnicode_IS_ASCII(s)) {
        p = (const char *)PyUnicode_DATA(s);
        n = PyUnicode_GET_LENGTH(s);
    }
    else { /* a temporary UTF-8 copy: PyUnicode_AsUTF8 would keep one inside the str */
        tmp = PyUnicode_AsUTF8String(s);
        if (tmp == NULL)
            return -1;
        p = PyBytes_AS_STRING(tmp);
        n = PyBytes_GET_SIZE(tmp);
    }
    /* worst case: every byte as \u00XX */
    if (sb_reserve(b, 6 * n + 2) < 0) {
        Py_XDECREF(tmp);
        return -1;
    }
    char *o = b->buf + b->len;
    *o++ = '"';
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o++ = '"';
    b->len = o - b->buf;
    Py_XDECREF(tmp);
    return 0;
}

/* 0: written; 1: declined; 2: declined, a type absent from the encoders; -1: error. */
static PyObject *str_to_json;

static int put_value(sbuf *b, PyObject *v, int depth, PyObject *encoders);

/* {"name": getattr(obj, name), ...} for the str names of the tuple `names`, the
 * values one level below `depth`: 0 written, 1 declined (a name not a str, or a
 * value declined), -1 error. */
static int
put_fields(sbuf *b, PyObject *obj, PyObject *names, int depth, PyObject *encoders)
{
    if (sb_put(b, "{", 1) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (Py_TYPE(name) != &PyUnicode_Type)
            return 1;
        if (i && sb_put(b, ",", 1) < 0)
            return -1;
        int rc = put_string(b, name);
        if (rc)
            return rc;
        if (sb_put(b, ":", 1) < 0)
            return -1;
        PyObject *field = PyObject_GetAttr(obj, name);
        if (field == NULL)
            return -1;
        rc = put_value(b, field, depth + 1, encoders);
        Py_DECREF(field);
        if (rc)
            return rc;
    }
    return sb_put(b, "}", 1);
}

/* {"name": value, ...} of a pydantic model's fields, read from its __dict__: for
 * field i, its str name names[i] and its JSON text before the value, heads[i]
 * (bytes: '{"name":' for the first, ',"name":' after). 0 written, 1 declined (a
 * field missing from the dict, or a value declined), 2 or -1 as put_value. */
static int
put_model_fields(sbuf *b, PyObject *obj, PyObject *names, PyObject *heads, int depth,
                 PyObject *encoders)
{
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n == 0 || !PyTuple_Check(heads) || PyTuple_GET_SIZE(heads) != n)
        return 1;
    PyObject *dict = PyObject_GenericGetDict(obj, NULL);
    if (dict == NULL) { /* no __dict__: the serialiser writes it */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 1;
    }
    int rc = PyDict_Check(dict) ? 0 : 1;
    /* pydantic fills __dict__ in field order with the schema's own name objects:
     * walk it alongside the names while they match, then look the rest up */
    Py_ssize_t pos = 0;
    int in_order = 1;
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *head = PyTuple_GET_ITEM(heads, i);
        if (Py_TYPE(name) != &PyUnicode_Type || !PyBytes_Check(head)) {
            rc = 1;
            break;
        }
        PyObject *key, *field = NULL; /* borrowed */
        if (in_order && PyDict_Next(dict, &pos, &key, &field) && key == name) {
            /* the i-th entry is this field's */
        }
        else {
            in_order = 0;
            field = PyDict_GetItemWithError(dict, name);
        }
        if (field == NULL) {
            rc = PyErr_Occurred() ? -1 : 1;
            break;
        }
        if ((rc = sb_put(b, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head))) != 0)
            break;
        Py_INCREF(field); /* a nested model's serialiser may run Python code: hold it */
        rc = put_value(b, field, depth + 1, encoders);
        Py_DECREF(field);
    }
    if (rc == 0)
        rc = sb_put(b, "}", 1);
    Py_DECREF(dict);
    return rc;
}

static int
put_value(sbuf *b, PyObject *v, int depth, PyObject *encoders)
{
    PyTypeObject *t = Py_TYPE(v);
    if (v == Py_None)
        return sb_put(b, "null", 4);
    if (v == Py_True)
        return sb_put(b, "true", 4);
    if (v == Py_False)
        return sb_put(b, "false", 5);
    if (t == &PyLong_Type) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return 1;
        char tmp[32];
        int n = snprintf(tmp, sizeof tmp, "%lld", x);
        return sb_put(b, tmp, n);
    }
    if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(v);
        if (!isfinite(x))
            return 1;
        char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (r == NULL)
            return -1;
        int rc = sb_put(b, r, (Py_ssize_t)strlen(r));
        PyMem_Free(r);
        return rc;
    }
    if (t == &PyUnicode_Type)
        return put_string(b, v);
    if (depth >= MAX_DEPTH)
        return 1;
    if (t == &PyList_Type || t == &PyTuple_Type) {
        Py_ssize_t n = t == &PyList_Type ? PyList_GET_SIZE(v) : PyTuple_GET_SIZE(v);
        if (sb_put(b, "[", 1) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i && sb_put(b, ",", 1) < 0)
                return -1;
            PyObject *item = t == &PyList_Type ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
            int rc = put_value(b, item, depth + 1, encoders);
            if (rc)
                return rc;
        }
        return sb_put(b, "]", 1);
    }
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        int first = 1;
        if (sb_put(b, "{", 1) < 0)
            return -1;
        while (PyDict_Next(v, &pos, &key, &value)) {
            if (Py_TYPE(key) != &PyUnicode_Type)
                return 1;
            if (!first && sb_put(b, ",", 1) < 0)
                return -1;
            first = 0;
            int rc = put_string(b, key);
            if (rc)
                return rc;
            if (sb_put(b, ":", 1) < 0)
                return -1;
            rc = put_value(b, value, depth + 1, encoders);
            if (rc)
                return rc;
        }
        return sb_put(b, "}", 1);
    }
    if (encoders == NULL)
        return 1;
    PyObject *enc = PyDict_GetItemWithError(encoders, (PyObject *)t); /* borrowed */
    if (enc == NULL) /* a type not seen yet: 2, so no model's serialiser takes over (below) */
        return PyErr_Occurred() ? -1 : 2;
    if (PyTuple_Check(enc)) /* a dataclass: its field names */
        return put_fields(b, v, enc, depth, encoders);
    if (enc == Py_None)
        return 1;
    if (PyList_CheckExact(enc) && PyList_GET_SIZE(enc) == 3 &&
        PyTuple_Check(PyList_GET_ITEM(enc, 0))) {
        /* [field names, serialiser, heads]: a plain pydantic model (plain_models.py);
         * its fields as they are, else (a value the walk does not write) its serialiser */
        Py_ssize_t start = b->len;
        int rc = put_model_fields(b, v, PyList_GET_ITEM(enc, 0), PyList_GET_ITEM(enc, 2),
                                  depth, encoders);
        if (rc != 1) /* written, an error, or a type not seen yet (the caller's Python
                      * path sees it, and later batches write it here) */
            return rc;
        b->len = start;
        enc = PyList_GET_ITEM(enc, 1);
    }
    /* a pydantic model: its serialiser's JSON bytes (valid UTF-8), written as they are */
    PyObject *text = PyObject_CallMethodOneArg(enc, str_to_json, v);
    if (text == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* the caller's json path names it */
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    int rc = PyBytes_Check(text) ? sb_put(b, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text)) : 1;
    Py_DECREF(text);
    return rc;
}

static PyObject *
dumps_with(PyObject *value, PyObject *encoders)
{
    sbuf b = {NULL, 0, 0};
    /* start at a size that holds a typical row's payload */
    b.buf = PyMem_Malloc(512);
    if (b.buf == NULL)
        return PyErr_NoMemory();
    b.cap = 512;
    int rc = put_value(&b, value, 0, encoders);
    PyObject *out;
    if (rc < 0)
        out = NULL;
    else if (rc > 0)
        out = Py_NewRef(Py_NotImplemented);
    else
        out = PyUnicode_DecodeUTF8(b.buf, b.len, "strict");
    PyMem_Free(b.buf);
    return out;
}

static PyObject *
jsoncopy_dumps(PyObject *self, PyObject *value)
{
    return dumps_with(value, NULL);
}

static PyObject *
jsoncopy_dumps_encoders(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dumps_encoders(value, encoders) takes a dict of encoders");
        return NULL;
    }
    return dumps_with(args[0], args[1]);
}


static PyObject *
jsoncopy_copy_fields(PyObject *self, PyObject *args)
{
    PyObject *obj, *names;
    PyTypeObject *cls;
    if (!PyArg_ParseTuple(args, "OO!O!", &obj, &PyType_Type, &cls, &PyTuple_Type, &names))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *out = cls->tp_alloc(cls, 0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *value = PyObject_GetAttr(obj, name);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *c = copy_value(value, 0);
        Py_DECREF(value);
        if (c == NULL || c == Py_NotImplemented) {
            Py_DECREF(out);
            return c;
        }
        int rc = PyObject_SetAttr(out, name, c);
        Py_DECREF(c);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    untrack_if_leaves(out);
    return out;
}

static int
kind_ok(PyObject *v, char kind)
{
    PyTypeObject *t = Py_TYPE(v);
    switch (kind) {
    case 'S':
        if (v == Py_None)
            return 1;
        /* fall through */
    case 's':
        return t == &PyUnicode_Type && PyUnicode_IS_ASCII(v);
    case 'i': {
        if (t != &PyLong_Type)
            return 0;
        int overflow;
        PyLong_AsLongLongAndOverflow(v, &overflow);
        return !overflow;
    }
    case 'f':
        return t == &PyFloat_Type && isfinite(PyFloat_AS_DOUBLE(v));
    }
    return 0;
}

static PyObject *
jsoncopy_copy_checked(PyObject *self, PyObject *args)
{
    PyObject *obj, *spec;
    PyTypeObject *cls;
    if (!PyArg_ParseTuple(args, "OO!O!", &obj, &PyType_Type, &cls, &PyTuple_Type, &spec))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    PyObject *out = cls->tp_alloc(cls, 0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(pair, 1))) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "spec must hold (name, kind) pairs");
            return NULL;
        }
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 1));
        if (kind == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *value = PyObject_GetAttr(obj, name);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        if (!kind_ok(value, kind[0])) {
            Py_DECREF(value);
            Py_DECREF(out);
            Py_RETURN_NOTIMPLEMENTED;
        }
        int rc = PyObject_SetAttr(out, name, value);
        Py_DECREF(value);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    untrack_if_leaves(out);
    return out;
}

/* check_row(row, row_cls, meta_cls, exp_cls, spec): True when `row` is exactly
 * a row_cls whose "id" is a non-empty ASCII str, whose "exp_meta" is exactly a
 * meta_cls with the spec's fields of exactly the spec's types (as copy_checked
 * checks them) and whose "exp_data" is exactly an exp_cls; False otherwise.
 * Nothing is copied: the in-memory storage keeps such a row as given. */
static PyObject *names_id, *names_meta, *names_data;

static int
check_attr(PyObject *obj, PyObject *name, PyTypeObject *want)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    int ok = Py_TYPE(value) == want;
    Py_DECREF(value);
    return ok;
}

/* 1: the row passes (see check_row); 0: it does not; -1: error. */
static int
row_ok(PyObject *row, PyTypeObject *row_cls, PyTypeObject *meta_cls, PyTypeObject *exp_cls,
       PyObject *spec)
{
    if (Py_TYPE(row) != row_cls)
        return 0;
    PyObject *row_id = PyObject_GetAttr(row, names_id);
    if (row_id == NULL)
        return -1;
    int ok = Py_TYPE(row_id) == &PyUnicode_Type && PyUnicode_IS_ASCII(row_id) &&
             PyUnicode_GET_LENGTH(row_id) > 0;
    Py_DECREF(row_id);
    if (!ok)
        return 0;
    int rc = check_attr(row, names_data, exp_cls);
    if (rc <= 0)
        return rc;
    PyObject *meta = PyObject_GetAttr(row, names_meta);
    if (meta == NULL)
        return -1;
    if (Py_TYPE(meta) != meta_cls) {
        Py_DECREF(meta);
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(spec, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(pair, 1))) {
            Py_DECREF(meta);
            PyErr_SetString(PyExc_TypeError, "spec must hold (name, kind) pairs");
            return -1;
        }
        const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 1));
        PyObject *value = kind == NULL ? NULL : PyObject_GetAttr(meta, PyTuple_GET_ITEM(pair, 0));
        if (value == NULL) {
            Py_DECREF(meta);
            return -1;
        }
        ok = kind_ok(value, kind[0]);
        Py_DECREF(value);
        if (!ok) {
            Py_DECREF(meta);
            return 0;
        }
    }
    Py_DECREF(meta);
    return 1;
}

static int
check_types(PyObject *const *args, int spec_at)
{
    if (!PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyTuple_Check(args[spec_at])) {
        PyErr_SetString(PyExc_TypeError, "row_cls, meta_cls, exp_cls must be types, spec a tuple");
        return -1;
    }
    return 0;
}

static PyObject *
jsoncopy_check_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "check_row(row, row_cls, meta_cls, exp_cls, spec) takes 5 arguments");
        return NULL;
    }
    if (check_types(args + 1, 3) < 0)
        return NULL;
    int rc = row_ok(args[0], (PyTypeObject *)args[1], (PyTypeObject *)args[2],
                    (PyTypeObject *)args[3], args[4]);
    if (rc < 0)
        return NULL;
    return PyBool_FromLong(rc);
}

/* records(rows, start, row_cls, meta_cls, exp_cls, spec, payload_names, encoders, out):
 * for rows[start], rows[start + 1], ... that pass check_row and whose payload
 * dumps_encoders writes, append to the list `out` None (a slot for the caller), the
 * row's id, its metadata values in spec order and the payload's JSON text. Stops at
 * the first row it cannot take and returns its index (len(rows) when it took them
 * all): the caller encodes that one its own way and calls again from the next. */
static PyObject *
jsoncopy_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "records(rows, start, row_cls, meta_cls, exp_cls, spec, payload_names, "
                        "encoders, out) takes 9 arguments");
        return NULL;
    }
    PyObject *rows = args[0], *spec = args[5], *names = args[6], *encoders = args[7];
    PyObject *out = args[8];
    if (check_types(args + 2, 3) < 0)
        return NULL;
    if (!(PyList_CheckExact(rows) || PyTuple_CheckExact(rows)) || !PyTuple_Check(names) ||
        !PyDict_CheckExact(encoders) || !PyList_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError,
                        "records() takes a list or tuple of rows, a tuple of payload names, a "
                        "dict of encoders and a list to append to");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, k))) {
            PyErr_SetString(PyExc_TypeError, "payload names must be str");
            return NULL;
        }
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    PyTypeObject *row_cls = (PyTypeObject *)args[2], *meta_cls = (PyTypeObject *)args[3];
    PyTypeObject *exp_cls = (PyTypeObject *)args[4];
    Py_ssize_t n_spec = PyTuple_GET_SIZE(spec);
    sbuf b = {NULL, 0, 0};
    b.buf = PyMem_Malloc(512);
    if (b.buf == NULL)
        return PyErr_NoMemory();
    b.cap = 512;
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < PySequence_Fast_GET_SIZE(rows); i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(rows, i);
        int rc = row_ok(row, row_cls, meta_cls, exp_cls, spec);
        if (rc < 0)
            goto error;
        if (rc == 0)
            break;
        PyObject *exp = PyObject_GetAttr(row, names_data);
        if (exp == NULL)
            goto error;
        b.len = 0;
        rc = put_fields(&b, exp, names, 0, encoders); /* as dumps_encoders writes the dict */
        Py_DECREF(exp);
        if (rc < 0)
            goto error;
        if (rc > 0)
            break;
        Py_ssize_t at = PyList_GET_SIZE(out);
        if (PyList_Append(out, Py_None) < 0)
            goto error;
        PyObject *value = PyObject_GetAttr(row, names_id);
        if (value == NULL || PyList_Append(out, value) < 0) {
            Py_XDECREF(value);
            goto undo;
        }
        Py_DECREF(value);
        PyObject *meta = PyObject_GetAttr(row, names_meta);
        if (meta == NULL)
            goto undo;
        for (Py_ssize_t k = 0; k < n_spec; k++) {
            PyObject *name = PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, k), 0);
            value = PyObject_GetAttr(meta, name);
            if (value == NULL || PyList_Append(out, value) < 0) {
                Py_XDECREF(value);
                Py_DECREF(meta);
                goto undo;
            }
            Py_DECREF(value);
        }
        Py_DECREF(meta);
        value = PyUnicode_DecodeUTF8(b.buf, b.len, "strict");
        if (value == NULL || PyList_Append(out, value) < 0) {
            Py_XDECREF(value);
            goto undo;
        }
        Py_DECREF(value);
        continue;
    undo: /* the row's slots appended so far are taken back */
        PyList_SetSlice(out, at, PyList_GET_SIZE(out), NULL);
        goto error;
    }
    PyMem_Free(b.buf);
    return PyLong_FromSsize_t(i);
error:
    PyMem_Free(b.buf);
    return NULL;
}

static PyObject *
jsoncopy_untrack(PyObject *self, PyObject *obj)
{
    return PyBool_FromLong(untrack_if_leaves(obj));
}

static PyObject *
jsoncopy_copy(PyObject *self, PyObject *value)
{
    return copy_value(value, 0);
}

/* FNV-1a, 64 bits, over the UTF-8 bytes of each str of the list `ids`, as signed
 * integers: the keys of a SQLite experience store's id tables (see
 * replaystore.experience.storage.sqlite). A stable function of the text alone,
 * the same in every process and in rows.id_hash (the Python stand-in). */
static PyObject *
jsoncopy_id_hashes(PyObject *self, PyObject *ids)
{
    if (!PyList_Check(ids)) {
        PyErr_Format(PyExc_TypeError, "id_hashes() takes a list of str, not %.100s",
                     Py_TYPE(ids)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        if (!PyUnicode_Check(id)) {
            PyErr_Format(PyExc_TypeError, "id_hashes(): item %zd is %.100s, not str", i,
                         Py_TYPE(id)->tp_name);
            Py_DECREF(out);
            return NULL;
        }
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(id, &size);
        if (text == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        uint64_t h = 0xcbf29ce484222325ULL;
        for (Py_ssize_t k = 0; k < size; k++) {
            h ^= (unsigned char)text[k];
            h *= 0x100000001b3ULL;
        }
        PyObject *value = PyLong_FromLongLong((long long)(int64_t)h);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}

/* distinct_pairs(values, keys): the distinct (values[i], keys[i]) pairs whose value
 * is not None, in order of first appearance; both lists of the same length, the
 * values str or None, the keys str (compared with ==). A pair equal to the one
 * before is skipped
 * with two comparisons (rows of one task come in runs), so few tuples are made. */
static PyObject *
jsoncopy_distinct_pairs(PyObject *self, PyObject *args)
{
    PyObject *values, *keys;
    if (!PyArg_ParseTuple(args, "O!O!:distinct_pairs", &PyList_Type, &values, &PyList_Type,
                          &keys))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "distinct_pairs(): the lists' lengths differ");
        return NULL;
    }
    PyObject *seen = PyDict_New(), *out = PyList_New(0);
    if (seen == NULL || out == NULL)
        goto error;
    PyObject *last_value = NULL, *last_key = NULL; /* borrowed from the lists */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyList_GET_ITEM(values, i), *key = PyList_GET_ITEM(keys, i);
        if ((value != Py_None && !PyUnicode_CheckExact(value)) || !PyUnicode_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError,
                            "distinct_pairs(): values must be str or None, keys str");
            goto error;
        }
        if (value == Py_None)
            continue;
        if (last_value != NULL &&
            (value == last_value || PyUnicode_Compare(value, last_value) == 0) &&
            (key == last_key || PyUnicode_Compare(key, last_key) == 0))
            continue;
        last_value = value;
        last_key = key;
        PyObject *pair = PyTuple_Pack(2, value, key);
        if (pair == NULL)
            goto error;
        int found = PyDict_Contains(seen, pair);
        if (found < 0 || (!found && (PyDict_SetItem(seen, pair, Py_None) < 0 ||
                                     PyList_Append(out, pair) < 0))) {
            Py_DECREF(pair);
            goto error;
        }
        Py_DECREF(pair);
    }
    Py_DECREF(seen);
    return out;
error:
    Py_XDECREF(seen);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"copy", jsoncopy_copy, METH_O,
     "copy(value) -> deep copy equal to json.loads(json.dumps(value)), or NotImplemented."},
    {"copy_fields", jsoncopy_copy_fields, METH_VARARGS,
     "copy_fields(obj, cls, names) -> new cls whose names are copies of obj's, or NotImplemented."},
    {"copy_checked", jsoncopy_copy_checked, METH_VARARGS,
     "copy_checked(obj, cls, spec) -> new cls with obj's fields of exactly the spec's types."},
    {"untrack", jsoncopy_untrack, METH_O,
     "untrack(obj) -> whether obj is now untracked (only when its referents are)."},
    {"check_row", (PyCFunction)(void (*)(void))jsoncopy_check_row, METH_FASTCALL,
     "check_row(row, row_cls, meta_cls, exp_cls, spec) -> whether row passes without a copy."},
    {"dumps_encoders", (PyCFunction)(void (*)(void))jsoncopy_dumps_encoders, METH_FASTCALL,
     "dumps_encoders(value, encoders) -> dumps, with models and dataclasses by their encoders."},
    {"records", (PyCFunction)(void (*)(void))jsoncopy_records, METH_FASTCALL,
     "records(rows, start, row_cls, meta_cls, exp_cls, spec, payload_names, encoders, out) "
     "-> index of the first row not appended to out."},
    {"distinct_pairs", jsoncopy_distinct_pairs, METH_VARARGS,
     "distinct_pairs(values, keys) -> the distinct (value, key) pairs, value not None, in order."},
    {"id_hashes", jsoncopy_id_hashes, METH_O,
     "id_hashes(ids) -> the 64-bit FNV-1a hash of each str's UTF-8 bytes, as signed ints."},
    {"dumps", jsoncopy_dumps, METH_O,
     "dumps(value) -> compact JSON text as replaystore's encoder writes it, or NotImplemented."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._jsoncopy",
    "Compiled snapshot of plain JSON values (in-memory experience storage).", -1, methods,
};

PyMODINIT_FUNC
PyInit__jsoncopy(void)
{
    names_id = PyUnicode_InternFromString("id");
    names_meta = PyUnicode_InternFromString("exp_meta");
    names_data = PyUnicode_InternFromString("exp_data");
    str_to_json = PyUnicode_InternFromString("to_json");
    if (names_id == NULL || names_meta == NULL || names_data == NULL || str_to_json == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    /* dumps_encoders takes [field names, serialiser, heads] (plain pydantic models) */
    if (m != NULL && PyModule_AddIntConstant(m, "PLAIN_MODELS", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
