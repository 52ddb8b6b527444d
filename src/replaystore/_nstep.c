/* Compiled kernel of replaystore.transitions.nstep: the n-step window of each sample.
 *
 *   window(t, flags, reward, powers, n, pointer, ret, next_src, next_out, done, discount,
 *          term, term_flag)
 *
 * For each sampled storage position t[b] of a ring of cap = len(flags[0]) rows,
 * walks k = 0, 1, ... over the positions t + k (wrapping at cap), adding
 * powers[k] * reward[pos] in the reward's precision and in k order (the NumPy
 * path's products and its sum over k, so both give the same values), and stops
 * at the first k where one of the end flags is set, where pos is the newest
 * stored row (pointer - 1, modulo cap), or at k = n - 1. Then:
 *   ret[b] = the sum; row b of next_out = row pos of next_src (the next_obs of
 *   the window's last step, copied byte for byte); done[b] = an end flag is set
 *   at pos; discount[b] = (float)powers[k + 1]; and, unless term is None,
 *   term[b] = flags[term_flag][pos] != 0.
 *
 * Arguments: t int64[B]; flags a tuple of 1 to 3 uint8[cap] arrays (the done,
 * terminated and truncated columns; non-zero is true); reward float32[cap] or
 * float64[cap]; powers float64[n + 1]; next_src any C-contiguous array of cap
 * rows (the next_obs column) and next_out one of B rows of the same row size;
 * outputs ret (the reward's dtype), done (uint8 or bool), discount float32
 * and term (uint8, bool or None), each [B]; n, pointer and term_flag integers.
 * All but next_src / next_out
 * 1-d and C-contiguous, of these exact types, else TypeError / ValueError.
 * Every t[b] must be in [0, cap) (ValueError names the first that is not).
 * The loop runs without the GIL.
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
enum {
    B_T, B_REWARD, B_POWERS, B_RET, B_NEXT_SRC, B_NEXT_OUT, B_DONE, B_DISCOUNT, B_TERM, B_COUNT
};

static PyObject *
nstep_window(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "window takes 13 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *to = args[0], *flagso = args[1], *rewardo = args[2], *powerso = args[3];
    PyObject *reto = args[6], *srco = args[7], *outo = args[8], *doneo = args[9];
    PyObject *discounto = args[10], *termo = args[11];
    if (!PyTuple_Check(flagso)) {
        PyErr_SetString(PyExc_TypeError, "window: flags must be a tuple of arrays");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    Py_ssize_t pointer = PyLong_AsSsize_t(args[5]);
    Py_ssize_t term_flag = PyLong_AsSsize_t(args[12]);
    if ((n == -1 || pointer == -1 || term_flag == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t nflags = PyTuple_GET_SIZE(flagso);
    if (nflags < 1 || nflags > MAX_FLAGS || n < 1) {
        PyErr_SetString(PyExc_ValueError, "window needs 1 to 3 flag arrays and n >= 1");
        return NULL;
    }
    int has_term = termo != Py_None;
    if (has_term && (term_flag < 0 || term_flag >= nflags)) {
        PyErr_SetString(PyExc_ValueError, "term_flag must index flags");
        return NULL;
    }
    Py_buffer views[B_COUNT], fviews[MAX_FLAGS];
    int got[B_COUNT] = {0}, fgot[MAX_FLAGS] = {0};
    PyObject *result = NULL;
    Py_ssize_t bad = -1;

    for (Py_ssize_t i = 0; i < nflags; i++) {
        if (get_buffer(PyTuple_GET_ITEM(flagso, i), &fviews[i], 'B', 1, 0, "flags") < 0)
            goto done;
        fgot[i] = 1;
    }
    /* The reward's precision decides the sum's and ret's. */
    Py_buffer probe;
    if (PyObject_GetBuffer(rewardo, &probe, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    int is_double = probe.itemsize == 8;
    PyBuffer_Release(&probe);
    char rfmt = is_double ? 'd' : 'f';
    Py_ssize_t rsize = is_double ? 8 : 4;
    if (get_buffer(to, &views[B_T], 'q', 8, 0, "t") < 0)
        goto done;
    got[B_T] = 1;
    if (get_buffer(rewardo, &views[B_REWARD], rfmt, rsize, 0, "reward") < 0)
        goto done;
    got[B_REWARD] = 1;
    if (get_buffer(powerso, &views[B_POWERS], 'd', 8, 0, "powers") < 0)
        goto done;
    got[B_POWERS] = 1;
    if (get_buffer(reto, &views[B_RET], rfmt, rsize, 1, "ret") < 0)
        goto done;
    got[B_RET] = 1;
    if (PyObject_GetBuffer(srco, &views[B_NEXT_SRC], PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    got[B_NEXT_SRC] = 1;
    if (PyObject_GetBuffer(outo, &views[B_NEXT_OUT], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    got[B_NEXT_OUT] = 1;
    if (get_buffer(doneo, &views[B_DONE], 'B', 1, 1, "done") < 0)
        goto done;
    got[B_DONE] = 1;
    if (get_buffer(discounto, &views[B_DISCOUNT], 'f', 4, 1, "discount") < 0)
        goto done;
    got[B_DISCOUNT] = 1;
    if (has_term) {
        if (get_buffer(termo, &views[B_TERM], 'B', 1, 1, "term") < 0)
            goto done;
        got[B_TERM] = 1;
    }

    Py_ssize_t rows = views[B_T].shape[0], cap = fviews[0].shape[0];
    int sizes_ok = views[B_REWARD].shape[0] == cap && views[B_POWERS].shape[0] == n + 1 &&
                   views[B_RET].shape[0] == rows &&
                   views[B_NEXT_SRC].len % cap == 0 &&
                   views[B_NEXT_OUT].len == views[B_NEXT_SRC].len / cap * rows &&
                   views[B_DONE].shape[0] == rows && views[B_DISCOUNT].shape[0] == rows &&
                   (!has_term || views[B_TERM].shape[0] == rows) && cap > 0 && pointer >= 0 &&
                   pointer < cap;
    for (Py_ssize_t i = 1; i < nflags; i++)
        sizes_ok = sizes_ok && fviews[i].shape[0] == cap;
    if (!sizes_ok) {
        PyErr_SetString(PyExc_ValueError,
                        "window: flags, reward and next_src need cap rows, powers n + 1 "
                        "values, the outputs len(t) rows, and 0 <= pointer < cap");
        goto done;
    }

    const int64_t *tp = (const int64_t *)views[B_T].buf;
    const double *pw = (const double *)views[B_POWERS].buf;
    const uint8_t *fl[MAX_FLAGS] = {NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < nflags; i++)
        fl[i] = (const uint8_t *)fviews[i].buf;
    const Py_ssize_t row_bytes = views[B_NEXT_SRC].len / cap;
    const char *srcp = (const char *)views[B_NEXT_SRC].buf;
    char *outp = (char *)views[B_NEXT_OUT].buf;
    uint8_t *donep = (uint8_t *)views[B_DONE].buf;
    float *discp = (float *)views[B_DISCOUNT].buf;
    uint8_t *termp = has_term ? (uint8_t *)views[B_TERM].buf : NULL;
    const uint8_t *termflags = has_term ? fl[term_flag] : NULL;
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
            if (is_double)
                accd += pw[k] * ((const double *)views[B_REWARD].buf)[pos];
            else
                accf += (float)pw[k] * ((const float *)views[B_REWARD].buf)[pos];
            for (Py_ssize_t i = 0; i < nflags; i++)
                ended |= fl[i][pos] != 0;
            if (ended || pos == newest || k == n - 1)
                break;
            k++;
            pos = pos + 1 == cap ? 0 : pos + 1;
        }
        if (is_double)
            ((double *)views[B_RET].buf)[b] = accd;
        else
            ((float *)views[B_RET].buf)[b] = accf;
        memcpy(outp + b * row_bytes, srcp + pos * row_bytes, (size_t)row_bytes);
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
    for (int i = 0; i < MAX_FLAGS; i++)
        if (fgot[i])
            PyBuffer_Release(&fviews[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"window", (PyCFunction)(void (*)(void))nstep_window, METH_FASTCALL,
     "window(t, flags, reward, powers, n, pointer, ret, next_src, next_out, done, discount, "
     "term, term_flag) -> None: the n-step window of each position t (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore._nstep",
    "Compiled kernel of replaystore.transitions.nstep's n-step windows.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__nstep(void)
{
    return PyModule_Create(&module);
}
