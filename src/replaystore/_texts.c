/* Compiled kernel of replaystore.trajectories.storage: a batch of format 4 texts.
 *
 *   crc32c(data) -> int
 *       The CRC-32C (Castagnoli) of a bytes-like object: the value google_crc32c
 *       and RFC 3720 give (initial value and final XOR 0xFFFFFFFF).
 *
 *   gather(data, offsets, lengths, expected, check) -> (bytes, int)
 *       data: the file (a memory map or any bytes-like object); offsets: int64[k],
 *       lengths: int32[k], expected: uint32[k] (each text's stored CRC-32C), check:
 *       uint8[k] (non-zero: verify this text's CRC-32C). Returns the JSON array
 *       "[" text_0 "," text_1 "," ... "]" made of the k texts (byte copies), and -1,
 *       or (b"", i) where i is the first text to verify whose CRC-32C differs.
 *       Every text must lie inside data (ValueError names the first that does not).
 *       The checks and copies run without the GIL.
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

static PyObject *
texts_gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "gather takes 5 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer data, offsets, lengths, expected, check;
    int got = 0;
    PyObject *result = NULL;
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

    const int64_t *off = (const int64_t *)offsets.buf;
    const int32_t *len = (const int32_t *)lengths.buf;
    const uint32_t *crc = (const uint32_t *)expected.buf;
    const uint8_t *chk = (const uint8_t *)check.buf;
    const uint8_t *src = (const uint8_t *)data.buf;
    Py_ssize_t total = 2 + (k > 1 ? k - 1 : 0);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (off[i] < 0 || len[i] < 0 || off[i] + len[i] > data.len) {
            PyErr_Format(PyExc_ValueError, "text %zd (bytes %lld..%lld) is outside the data",
                         i, (long long)off[i], (long long)off[i] + len[i]);
            goto done;
        }
        total += len[i];
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        if (chk[i] && crc32c(src + off[i], (size_t)len[i]) != crc[i]) {
            bad = i;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        result = Py_BuildValue("(y#n)", "", (Py_ssize_t)0, bad);
        goto done;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    char *dst = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    *dst++ = '[';
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i)
            *dst++ = ',';
        memcpy(dst, src + off[i], (size_t)len[i]);
        dst += len[i];
    }
    *dst = ']';
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(Nn)", out, (Py_ssize_t)-1);

done:
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
    {"gather", (PyCFunction)(void (*)(void))texts_gather, METH_FASTCALL,
     "gather(data, offsets, lengths, expected, check) -> (bytes, int): the texts as one "
     "JSON array, after checking the CRC-32C of those marked (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._texts",
    "Compiled kernel of format 4 trajectory texts: CRC-32C checks and one JSON array.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__texts(void)
{
    make_table();
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
