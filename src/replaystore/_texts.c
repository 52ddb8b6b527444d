/* Compiled kernel of replaystore.trajectories.storage: a batch of format 4 texts.
 *
 *   crc32c(data) -> int
 *       The CRC-32C (Castagnoli) of a bytes-like object: the value google_crc32c
 *       and RFC 3720 give (initial value and final XOR 0xFFFFFFFF).
 *
 *   parse(data, offsets, lengths, expected, check, loads, values, slots, chat)
 *       -> (int, list)
 *       data: the file (a memory map or any bytes-like object); offsets: int64[k],
 *       lengths: int32[k], expected: uint32[k] (each text's stored CRC-32C), check:
 *       uint8[k] (non-zero: verify this text's CRC-32C); every text must lie inside
 *       data (ValueError names the first that does not). Each text is checked (where
 *       marked), then parsed on its own by loads(bytes) (pydantic-core's from_json, or
 *       json.loads) and its value put in values[slots[i]] (values: a list; slots:
 *       int64[k], each inside values): no joined copy of the texts is made, and each
 *       text's bytes are a small object freed after its parse. chat: uint8[k],
 *       non-zero where the value must be a plain chat message (a dict whose "role" is
 *       a str and that has a "content"). Returns (-1, the slots whose value is not),
 *       or (i, []) where i is the first text to verify whose CRC-32C differs. An
 *       exception of loads propagates. Either way values then holds the texts before.
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

static int
typed_array(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *formats,
            const char *name, Py_ssize_t count)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '=' || f[0] == '<' || f[0] == '@')
        f++;
    if (view->ndim != 1 || view->itemsize != itemsize || f[0] == '\0' || f[1] != '\0' ||
        strchr(formats, f[0]) == NULL || (count >= 0 && view->shape[0] != count)) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a 1-d contiguous array of %zd-byte items (%s), of the "
                     "length of offsets",
                     name, itemsize, formats);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
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

static PyObject *
texts_parse(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "parse takes 9 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *loads = args[5], *values = args[6];
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "values must be a list");
        return NULL;
    }
    Py_buffer data, offsets, lengths, expected, check, slots, chat;
    int got = 0;
    PyObject *result = NULL, *invalid = NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    got = 1;
    if (typed_array(args[1], &offsets, 8, "qlL", "offsets", -1) < 0)
        goto done;
    got = 2;
    Py_ssize_t k = offsets.shape[0];
    if (typed_array(args[2], &lengths, 4, "iI", "lengths", k) < 0)
        goto done;
    got = 3;
    if (typed_array(args[3], &expected, 4, "IiL", "expected", k) < 0)
        goto done;
    got = 4;
    if (typed_array(args[4], &check, 1, "B?b", "check", k) < 0)
        goto done;
    got = 5;
    if (typed_array(args[7], &slots, 8, "qlL", "slots", k) < 0)
        goto done;
    got = 6;
    if (typed_array(args[8], &chat, 1, "B?b", "chat", k) < 0)
        goto done;
    got = 7;

    const int64_t *off = (const int64_t *)offsets.buf;
    const int32_t *len = (const int32_t *)lengths.buf;
    const uint32_t *crc = (const uint32_t *)expected.buf;
    const uint8_t *chk = (const uint8_t *)check.buf;
    const int64_t *slot = (const int64_t *)slots.buf;
    const uint8_t *must_chat = (const uint8_t *)chat.buf;
    const uint8_t *src = (const uint8_t *)data.buf;
    Py_ssize_t n_values = PyList_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (off[i] < 0 || len[i] < 0 || off[i] + len[i] > data.len) {
            PyErr_Format(PyExc_ValueError, "text %zd (bytes %lld..%lld) is outside the data",
                         i, (long long)off[i], (long long)off[i] + len[i]);
            goto done;
        }
        if (slot[i] < 0 || slot[i] >= n_values) {
            PyErr_Format(PyExc_IndexError, "slot %lld of text %zd is outside values (%zd)",
                         (long long)slot[i], i, n_values);
            goto done;
        }
    }
    invalid = PyList_New(0);
    if (invalid == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < k; i++) {
        const uint8_t *text = src + off[i];
        if (chk[i] && crc32c(text, (size_t)len[i]) != crc[i]) {
            result = Py_BuildValue("(n[])", i);
            goto done;
        }
        PyObject *raw = PyBytes_FromStringAndSize((const char *)text, len[i]);
        if (raw == NULL)
            goto done;
        PyObject *value = PyObject_CallOneArg(loads, raw);
        Py_DECREF(raw);
        if (value == NULL)
            goto done;
        if (must_chat[i]) {
            int ok = is_chat_message(value);
            if (ok < 0) {
                Py_DECREF(value);
                goto done;
            }
            if (!ok) {
                PyObject *number = PyLong_FromLongLong(slot[i]);
                if (number == NULL || PyList_Append(invalid, number) < 0) {
                    Py_XDECREF(number);
                    Py_DECREF(value);
                    goto done;
                }
                Py_DECREF(number);
            }
        }
        PyList_SetItem(values, slot[i], value); /* steals value; the slot's old item goes */
    }
    result = Py_BuildValue("(nO)", (Py_ssize_t)-1, invalid);

done:
    Py_XDECREF(invalid);
    if (got >= 7)
        PyBuffer_Release(&chat);
    if (got >= 6)
        PyBuffer_Release(&slots);
    if (got >= 5)
        PyBuffer_Release(&check);
    if (got >= 4)
        PyBuffer_Release(&expected);
    if (got >= 3)
        PyBuffer_Release(&lengths);
    if (got >= 2)
        PyBuffer_Release(&offsets);
    if (got >= 1)
        PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"crc32c", (PyCFunction)texts_crc32c, METH_O,
     "crc32c(data) -> int: the CRC-32C of a bytes-like object."},
    {"parse", (PyCFunction)(void (*)(void))texts_parse, METH_FASTCALL,
     "parse(data, offsets, lengths, expected, check, loads, values, slots, chat) -> "
     "(int, list): each text checked and parsed on its own into values[slot] (see the "
     "module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._texts",
    "Compiled kernel of format 4 trajectory texts: CRC-32C checks and parses.", -1,
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
