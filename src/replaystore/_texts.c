/* Compiled kernel of replaystore.trajectories.storage: a batch of format 4 texts.
 *
 *   crc32c(data) -> int
 *       The CRC-32C (Castagnoli) of a bytes-like object: the value google_crc32c
 *       and RFC 3720 give (initial value and final XOR 0xFFFFFFFF).
 *
 *   samples(positions, arrays, maps, map_of, other, loads, parsed, copy) -> list
 *       The (messages, response) of each version 4 step at positions (a list of
 *       integers), read from the texts alone, as FileSource.sample_parts gives them, or
 *       None where the step must be read another way: its prompt is not split (count
 *       <= 0), its image URLs are relative, a text fails its check or is not one JSON
 *       value, a message is not a plain chat message, or any call below raises an
 *       Exception (cleared: the other way names it). arrays: the tuple (counts int32,
 *       starts int32/int64, responses int32/int64, relative uint8, refs int32, shared
 *       uint8, text_codec uint8, text_file int32, text_offset int64, text_length
 *       int32, text_crc uint32, verified uint8 writable) of Prompts. Texts stored raw
 *       that one step reads are checked on their first read (verified[t] set) and
 *       parsed here from maps[file] (a list; None: map_of(file) gives the map, which
 *       it also stores there); the others (shared, compressed) come from other(t), a
 *       new value each, except that a shared text found in parsed (a dict: 2 * t ->
 *       its value, kept by the reader) is copy(value) when copy is not None and
 *       gives no NotImplemented (a dict or list; other values are immutable and
 *       handed out as they are). A position outside counts raises IndexError.
 *
 * The CRC uses the SSE4.2 crc32 instruction when the CPU has it (checked once at
 * import), else a byte-at-a-time table; both give the same values (tested against
 * google_crc32c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

static uint32_t crc_table[256];
static int use_sse42 = 0;

static void
make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t
crc_update_table(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t
crc_update_sse42(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#endif

static uint32_t
crc32c(const uint8_t *p, size_t n)
{
#ifdef HAVE_SSE42_PATH
    if (use_sse42)
        return ~crc_update_sse42(0xFFFFFFFFu, p, n);
#endif
    return ~crc_update_table(0xFFFFFFFFu, p, n);
}

static PyObject *
texts_crc32c(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = crc32c((const uint8_t *)view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *role_key, *content_key;

static int
is_chat_message(PyObject *value)
{
    if (!PyDict_CheckExact(value))
        return 0;
    PyObject *role = PyDict_GetItemWithError(value, role_key);
    if (role == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyUnicode_CheckExact(role))
        return 0;
    return PyDict_Contains(value, content_key);
}

enum { A_COUNTS, A_STARTS, A_RESPONSES, A_RELATIVE, A_REFS, A_SHARED, A_CODEC, A_FILE,
       A_OFFSET, A_LENGTH, A_CRC, A_VERIFIED, N_ARRAYS };

static const char *array_names[N_ARRAYS] = {
    "counts", "starts", "responses", "relative", "refs", "shared", "text_codec",
    "text_file", "text_offset", "text_length", "text_crc", "verified",
};
/* each array's item size; 0: 4 or 8 (a signed integer of either width) */
static const Py_ssize_t array_sizes[N_ARRAYS] = {4, 0, 0, 1, 4, 1, 1, 4, 8, 4, 4, 1};

typedef struct {
    Py_buffer views[N_ARRAYS];
    int got;
    PyObject *maps, *map_of, *other, *loads, *parsed, *copy;
    Py_buffer *files; /* one view per file, acquired on first use */
    char *have_file;
    Py_ssize_t n_files;
} Reading;

static inline int64_t
item_of(const Py_buffer *view, Py_ssize_t i)
{
    if (view->itemsize == 8)
        return ((const int64_t *)view->buf)[i];
    return ((const int32_t *)view->buf)[i];
}

/* 1: *value is text t's value (a new reference); 0: the step must be read another
   way (any Exception cleared); -1: an error that is not an Exception. */
static int
text_value(Reading *r, int64_t t, int chat, PyObject **value)
{
    *value = NULL;
    Py_ssize_t n_texts = r->views[A_CRC].len / 4;
    if (t < 0 || t >= n_texts)
        return 0;
    const uint8_t *shared = (const uint8_t *)r->views[A_SHARED].buf;
    const uint8_t *codec = (const uint8_t *)r->views[A_CODEC].buf;
    PyObject *v;
    if (shared[t] && r->copy != Py_None) {
        PyObject *key = PyLong_FromLongLong(2 * t);
        if (key == NULL)
            return -1;
        PyObject *template = PyDict_GetItemWithError(r->parsed, key); /* borrowed */
        Py_DECREF(key);
        if (template == NULL && PyErr_Occurred())
            return -1;
        if (template != NULL) {
            if (PyDict_CheckExact(template) || PyList_CheckExact(template)) {
                Py_INCREF(template); /* held through the call, whatever it does */
                v = PyObject_CallOneArg(r->copy, template);
                Py_DECREF(template);
                if (v == NULL)
                    goto raised;
                if (v != Py_NotImplemented)
                    goto got;
                Py_DECREF(v);
            }
            else {
                Py_INCREF(template);
                v = template;
                goto got;
            }
        }
    }
    if (shared[t] || codec[t] != 0) {
        PyObject *number = PyLong_FromLongLong(t);
        if (number == NULL)
            return -1;
        v = PyObject_CallOneArg(r->other, number);
        Py_DECREF(number);
    }
    else {
        int32_t f = ((const int32_t *)r->views[A_FILE].buf)[t];
        if (f < 0 || f >= r->n_files)
            return 0;
        if (!r->have_file[f]) {
            /* the list may have changed in a call made since: checked, not assumed */
            PyObject *data = PyList_GetItem(r->maps, f); /* borrowed */
            if (data == NULL)
                return -1;
            PyObject *made = NULL;
            if (data == Py_None) {
                PyObject *number = PyLong_FromLong(f);
                if (number == NULL)
                    return -1;
                made = PyObject_CallOneArg(r->map_of, number);
                Py_DECREF(number);
                if (made == NULL)
                    goto raised;
                data = made;
            }
            int bad = PyObject_GetBuffer(data, &r->files[f], PyBUF_SIMPLE);
            Py_XDECREF(made);
            if (bad < 0)
                goto raised;
            r->have_file[f] = 1;
        }
        const Py_buffer *file = &r->files[f];
        int64_t off = ((const int64_t *)r->views[A_OFFSET].buf)[t];
        int32_t len = ((const int32_t *)r->views[A_LENGTH].buf)[t];
        if (off < 0 || len < 0 || off + len > file->len)
            return 0;
        const uint8_t *text = (const uint8_t *)file->buf + off;
        uint8_t *verified = (uint8_t *)r->views[A_VERIFIED].buf;
        if (!verified[t]) {
            if (crc32c(text, (size_t)len) != ((const uint32_t *)r->views[A_CRC].buf)[t])
                return 0;
            verified[t] = 1;
        }
        PyObject *raw = PyBytes_FromStringAndSize((const char *)text, len);
        if (raw == NULL)
            return -1;
        v = PyObject_CallOneArg(r->loads, raw);
        Py_DECREF(raw);
    }
got:
    if (v == NULL)
        goto raised;
    if (chat) {
        int ok = is_chat_message(v);
        if (ok <= 0) {
            Py_DECREF(v);
            return ok;
        }
    }
    *value = v;
    return 1;
raised:
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

static PyObject *
texts_samples(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "samples takes 8 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *positions = args[0], *arrays = args[1];
    Reading r = {.got = 0, .maps = args[2], .map_of = args[3], .other = args[4],
                 .loads = args[5], .parsed = args[6], .copy = args[7], .files = NULL,
                 .have_file = NULL, .n_files = 0};
    PyObject *out = NULL;
    if (!PyList_CheckExact(positions) || !PyTuple_CheckExact(arrays) ||
        PyTuple_GET_SIZE(arrays) != N_ARRAYS || !PyList_CheckExact(r.maps) ||
        !PyDict_CheckExact(r.parsed)) {
        PyErr_Format(PyExc_TypeError,
                     "samples takes a list of positions, a tuple of %d arrays, a list "
                     "of maps and a dict of parsed texts", N_ARRAYS);
        return NULL;
    }
    for (int a = 0; a < N_ARRAYS; a++) {
        int flags = PyBUF_C_CONTIGUOUS | (a == A_VERIFIED ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(arrays, a), &r.views[a], flags) < 0)
            goto done;
        r.got = a + 1;
        Py_ssize_t size = r.views[a].itemsize;
        if (array_sizes[a] ? size != array_sizes[a] : (size != 4 && size != 8)) {
            PyErr_Format(PyExc_TypeError, "samples: %s has %zd-byte items", array_names[a],
                         size);
            goto done;
        }
    }
    Py_ssize_t n_steps = r.views[A_COUNTS].len / 4;
    if (r.views[A_STARTS].len / r.views[A_STARTS].itemsize != n_steps ||
        r.views[A_RESPONSES].len / r.views[A_RESPONSES].itemsize != n_steps ||
        r.views[A_RELATIVE].len != n_steps) {
        PyErr_SetString(PyExc_ValueError, "samples: the per-step arrays differ in length");
        goto done;
    }
    Py_ssize_t n_texts = r.views[A_CRC].len / 4;
    if (r.views[A_SHARED].len != n_texts || r.views[A_CODEC].len != n_texts ||
        r.views[A_FILE].len / 4 != n_texts || r.views[A_OFFSET].len / 8 != n_texts ||
        r.views[A_LENGTH].len / 4 != n_texts || r.views[A_VERIFIED].len != n_texts) {
        PyErr_SetString(PyExc_ValueError, "samples: the per-text arrays differ in length");
        goto done;
    }
    Py_ssize_t n_refs = r.views[A_REFS].len / 4;
    r.n_files = PyList_GET_SIZE(r.maps);
    r.files = PyMem_Calloc(r.n_files ? r.n_files : 1, sizeof(Py_buffer));
    r.have_file = PyMem_Calloc(r.n_files ? r.n_files : 1, 1);
    if (r.files == NULL || r.have_file == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(positions);
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(out, i, Py_None);
    }
    const int32_t *counts = (const int32_t *)r.views[A_COUNTS].buf;
    const uint8_t *relative = (const uint8_t *)r.views[A_RELATIVE].buf;
    const int32_t *refs = (const int32_t *)r.views[A_REFS].buf;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(positions); i++) {
        PyObject *item = PyList_GET_ITEM(positions, i);
        Py_INCREF(item);
        Py_ssize_t p = PyNumber_AsSsize_t(item, PyExc_IndexError); /* ints, NumPy's too */
        Py_DECREF(item);
        if (p == -1 && PyErr_Occurred())
            goto fail;
        if (p < 0 || p >= n_steps) {
            PyErr_Format(PyExc_IndexError, "position %zd is outside the %zd steps", p, n_steps);
            goto fail;
        }
        int32_t count = counts[p];
        if (count <= 0 || relative[p])
            continue;
        int64_t start = item_of(&r.views[A_STARTS], p);
        int64_t response = item_of(&r.views[A_RESPONSES], p);
        if (start < 0 || start + count > n_refs || response < 0)
            continue;
        PyObject *messages = PyList_New(count);
        if (messages == NULL)
            goto fail;
        int ok = 1;
        for (int32_t j = 0; j < count && ok == 1; j++) {
            PyObject *v;
            ok = text_value(&r, refs[start + j], 1, &v);
            if (ok == 1)
                PyList_SET_ITEM(messages, j, v);
        }
        PyObject *reply = NULL;
        if (ok == 1)
            ok = text_value(&r, response, 0, &reply);
        if (ok == 1) {
            PyObject *pair = PyTuple_Pack(2, messages, reply);
            Py_DECREF(reply);
            if (pair == NULL)
                ok = -1;
            else
                PyList_SetItem(out, i, pair);
        }
        Py_DECREF(messages); /* unset items are NULL: a list frees those fine */
        if (ok < 0)
            goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    for (Py_ssize_t f = 0; r.have_file && f < r.n_files; f++)
        if (r.have_file[f])
            PyBuffer_Release(&r.files[f]);
    PyMem_Free(r.files);
    PyMem_Free(r.have_file);
    for (int a = 0; a < r.got; a++)
        PyBuffer_Release(&r.views[a]);
    return out;
}

static PyMethodDef methods[] = {
    {"crc32c", (PyCFunction)texts_crc32c, METH_O,
     "crc32c(data) -> int: the CRC-32C of a bytes-like object."},
    {"samples", (PyCFunction)(void (*)(void))texts_samples, METH_FASTCALL,
     "samples(positions, arrays, maps, map_of, other, loads, parsed, copy) -> list: "
     "(messages, "
     "response) of version 4 steps read from their texts, or None (see the module "
     "source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._texts",
    "Compiled kernel of format 4 trajectory texts: CRC-32C checks and samples' texts.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__texts(void)
{
    make_table();
    role_key = PyUnicode_InternFromString("role");
    content_key = PyUnicode_InternFromString("content");
    if (role_key == NULL || content_key == NULL)
        return NULL;
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    use_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "HARDWARE", use_sse42) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
