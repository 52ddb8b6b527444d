/* Compiled kernels of replaystore.sampling.recency_sample_without_replacement.
 *
 * The Python side draws the uniforms (NumPy's Generator, so a seed gives the
 * same stream whichever kernel runs) and these two loops do, in one pass each,
 * what the NumPy fallback does in about fifteen array passes:
 *
 *   accept(root, v, n, power, out) -> count
 *       root[i] is (f + (1 - f) * u[i]) ** (1 / (power + 1)) for a uniform u[i],
 *       f = (n + 1) ** -(power + 1): the inverse CDF, computed by NumPy (its
 *       vectorised cbrt/power is several times faster than libm's, and both
 *       paths then share it). For each i: x = root[i] * (n + 1),
 *       t = (x - floor(x)) / x; the pair is accepted when v < 1 - max(power, 1) * t,
 *       or else when v < (1 - t) ** power, and then floor(x) - 1, clipped to
 *       [0, n - 1], is written to out. The accepted ranks are i.i.d. with weights
 *       (rank + 1) ** power (see sampling._accept_recency for why). Same
 *       floating-point operations as the NumPy path, in the same order.
 *
 *   first_new(draws, mask, need, out, stamp) -> count
 *       Walks the draws in order and writes each rank whose mask byte is not
 *       `stamp` (1..255) to out, setting the byte to `stamp`, until `need`
 *       ranks are written: the first occurrences of the untaken ranks, in draw
 *       order, as the NumPy path's filter-then-first-occurrences does. A new
 *       stamp per call leaves the bytes of earlier calls meaning "untaken", so
 *       the mask is cleared only once every 255 calls.
 *
 * Arguments are C-contiguous buffers of the exact types (float64 root, v; int64
 * draws and out; uint8 mask of n bytes); anything else raises TypeError or
 * ValueError. Ranks are checked against the mask's length. The loops run
 * without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

static int
get_buffer(PyObject *obj, Py_buffer *view, const char *format, Py_ssize_t itemsize,
           int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '=' || f[0] == '<' || f[0] == '@')
        f++;
    int ok = view->itemsize == itemsize && view->ndim == 1;
    if (ok) {
        /* int64 is 'l' or 'q' depending on the platform; uint8 is 'B'. */
        if (format[0] == 'q')
            ok = (f[0] == 'q' || (f[0] == 'l' && sizeof(long) == 8)) && f[1] == '\0';
        else
            ok = f[0] == format[0] && f[1] == '\0';
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-d contiguous array of %s", name,
                     format[0] == 'd' ? "float64" : (format[0] == 'q' ? "int64" : "uint8"));
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
recency_accept(PyObject *self, PyObject *args)
{
    PyObject *uo, *vo, *outo;
    long long n;
    double power;
    if (!PyArg_ParseTuple(args, "OOLdO", &uo, &vo, &n, &power, &outo))
        return NULL;
    if (n < 1 || !(power > 0.0) || !isfinite(power)) {
        PyErr_SetString(PyExc_ValueError, "accept needs n >= 1 and a finite power > 0");
        return NULL;
    }
    Py_buffer u, v, out;
    if (get_buffer(uo, &u, "d", 8, 0, "root") < 0)
        return NULL;
    if (get_buffer(vo, &v, "d", 8, 0, "v") < 0) {
        PyBuffer_Release(&u);
        return NULL;
    }
    if (get_buffer(outo, &out, "q", 8, 1, "out") < 0) {
        PyBuffer_Release(&u);
        PyBuffer_Release(&v);
        return NULL;
    }
    Py_ssize_t m = u.shape[0];
    if (v.shape[0] != m || out.shape[0] < m) {
        PyBuffer_Release(&u);
        PyBuffer_Release(&v);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "accept needs len(v) == len(root) <= len(out)");
        return NULL;
    }
    const double *up = (const double *)u.buf, *vp = (const double *)v.buf;
    int64_t *op = (int64_t *)out.buf;
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS
    const double scale = (double)n + 1.0;
    const double slope = power > 1.0 ? power : 1.0;
    const int square = power == 2.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        double x = up[i] * scale;
        double whole = floor(x);
        double t = (x - whole) / x;
        double vi = vp[i];
        int ok = vi < 1.0 - slope * t;
        if (!ok) {
            double s = 1.0 - t;
            ok = vi < (square ? s * s : pow(s, power));
        }
        if (ok) {
            int64_t r = (int64_t)whole - 1;
            if (r < 0)
                r = 0;
            else if (r > n - 1)
                r = n - 1;
            op[count++] = r;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&u);
    PyBuffer_Release(&v);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(count);
}

static PyObject *
recency_first_new(PyObject *self, PyObject *args)
{
    PyObject *drawso, *masko, *outo;
    Py_ssize_t need;
    int stamp_arg;
    if (!PyArg_ParseTuple(args, "OOnOi", &drawso, &masko, &need, &outo, &stamp_arg))
        return NULL;
    if (stamp_arg < 1 || stamp_arg > 255) {
        PyErr_SetString(PyExc_ValueError, "first_new needs a stamp in [1, 255]");
        return NULL;
    }
    const uint8_t stamp = (uint8_t)stamp_arg;
    Py_buffer draws, mask, out;
    if (get_buffer(drawso, &draws, "q", 8, 0, "draws") < 0)
        return NULL;
    if (get_buffer(masko, &mask, "B", 1, 1, "mask") < 0) {
        PyBuffer_Release(&draws);
        return NULL;
    }
    if (get_buffer(outo, &out, "q", 8, 1, "out") < 0) {
        PyBuffer_Release(&draws);
        PyBuffer_Release(&mask);
        return NULL;
    }
    const int64_t *dp = (const int64_t *)draws.buf;
    uint8_t *mp = (uint8_t *)mask.buf;
    int64_t *op = (int64_t *)out.buf;
    Py_ssize_t m = draws.shape[0], n = mask.shape[0];
    if (need < 0 || need > out.shape[0]) {
        PyBuffer_Release(&draws);
        PyBuffer_Release(&mask);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "first_new needs 0 <= need <= len(out)");
        return NULL;
    }
    Py_ssize_t count = 0, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m && count < need; i++) {
        int64_t r = dp[i];
        if (r < 0 || r >= n) {
            bad = i;
            break;
        }
        if (mp[r] != stamp) {
            mp[r] = stamp;
            op[count++] = r;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&draws);
    PyBuffer_Release(&mask);
    PyBuffer_Release(&out);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "draws[%zd] is outside [0, %zd)", bad, n);
        return NULL;
    }
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"accept", recency_accept, METH_VARARGS,
     "accept(root, v, n, power, out) -> count: accepted recency ranks written to out."},
    {"first_new", recency_first_new, METH_VARARGS,
     "first_new(draws, mask, need, out, stamp) -> count: first untaken draws, stamping mask."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._recency",
    "Compiled kernels of replaystore.sampling's recency sampling.", -1, methods,
};

PyMODINIT_FUNC
PyInit__recency(void)
{
    return PyModule_Create(&module);
}
