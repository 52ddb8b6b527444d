/* Compiled kernels for replaystore.sampling.SumTree.
 *
 * The tree lives in NumPy arrays owned by the Python class; these functions
 * only read and write them through the buffer protocol (no NumPy headers).
 *
 * Layout (the same one the NumPy fallback uses): two flat float64 arrays,
 * `sums` and `mins`, holding every level one after the other, leaves first.
 * `offsets` (int64, depth + 2 entries) gives where each level starts; the
 * last level (index depth) is the root, a single node. Node k of level l + 1
 * has children F*k .. F*k + F - 1 of level l, and every level below the root
 * has a length that is a multiple of F.
 *
 * Arithmetic matches the NumPy fallback bit for bit: an internal sum is the
 * sequential sum of its children (NumPy: the last column of cumsum), a
 * descent compares against the sequential prefix sums of one row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_LEVELS 64
#define GROUP 4 /* values descended together by find */

/* Status codes returned to Python, which raises the matching exception. */
#define ST_OK 0
#define ST_BAD_INDEX 1
#define ST_NOT_FINITE 2
#define ST_NEGATIVE 3

/* Acquire a C-contiguous buffer of float64 ("d") or int64 ("l"/"q") items. */
static int
get_buffer(PyObject *obj, Py_buffer *view, int is_float, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (fmt[0] == '@' || fmt[0] == '=') {
        fmt++;
    }
    int ok = view->itemsize == 8 &&
             (is_float ? strcmp(fmt, "d") == 0 : (strcmp(fmt, "q") == 0 || strcmp(fmt, "l") == 0));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "_sumtree: expected a contiguous %s buffer, got format '%s'",
                     is_float ? "float64" : "int64", view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

typedef struct {
    Py_buffer sums, mins, offsets;
    const int64_t *off;
    Py_ssize_t depth;
} tree_views;

static void
release_tree(tree_views *t)
{
    if (t->sums.obj) PyBuffer_Release(&t->sums);
    if (t->mins.obj) PyBuffer_Release(&t->mins);
    if (t->offsets.obj) PyBuffer_Release(&t->offsets);
}

/* Acquire the tree arrays and check that the offsets describe them: every
 * level below the root holds whole rows of F children and has a parent level
 * with a node per row, so every index computed from a valid slot is in bounds. */
static int
get_tree(PyObject *sums, PyObject *mins, PyObject *offsets, Py_ssize_t fanout, int need_mins,
         int writable, tree_views *t)
{
    memset(t, 0, sizeof(*t));
    if (get_buffer(sums, &t->sums, 1, writable) < 0) goto fail;
    if (need_mins && get_buffer(mins, &t->mins, 1, writable) < 0) goto fail;
    if (get_buffer(offsets, &t->offsets, 0, 0) < 0) goto fail;
    Py_ssize_t n_off = t->offsets.len / 8;
    t->off = (const int64_t *)t->offsets.buf;
    t->depth = n_off - 2;
    Py_ssize_t n_nodes = t->sums.len / 8;
    int ok = fanout >= 2 && t->depth >= 1 && t->depth <= MAX_LEVELS && t->off[0] == 0 &&
             t->off[n_off - 1] == n_nodes && t->off[n_off - 1] - t->off[n_off - 2] == 1 &&
             (!need_mins || t->mins.len == t->sums.len);
    for (Py_ssize_t l = 0; ok && l < t->depth; l++) {
        int64_t size = t->off[l + 1] - t->off[l], parents = t->off[l + 2] - t->off[l + 1];
        ok = size > 0 && size % fanout == 0 && size / fanout <= parents;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "_sumtree: offsets do not describe the tree arrays");
        goto fail;
    }
    return 0;
fail:
    release_tree(t);
    return -1;
}

/* update(sums, mins, offsets, fanout, capacity, indices, priorities) -> status
 *
 * Validates every index and priority and allocates its scratch space before
 * writing anything (an error leaves the tree unchanged); on success sets
 * the leaves in order (the last value wins for repeated indices) and recomputes
 * each touched internal node once per level.
 */
static PyObject *
sumtree_update(PyObject *self, PyObject *args)
{
    PyObject *o_sums, *o_mins, *o_off, *o_idx, *o_pri;
    Py_ssize_t fanout, capacity;
    if (!PyArg_ParseTuple(args, "OOOnnOO", &o_sums, &o_mins, &o_off, &fanout, &capacity, &o_idx,
                          &o_pri)) {
        return NULL;
    }
    tree_views t;
    Py_buffer vi = {0}, vp = {0};
    int64_t *touched = NULL;
    long status = ST_OK;
    if (get_tree(o_sums, o_mins, o_off, fanout, 1, 1, &t) < 0) return NULL;
    if (get_buffer(o_idx, &vi, 0, 0) < 0) goto fail;
    if (get_buffer(o_pri, &vp, 1, 0) < 0) goto fail;
    Py_ssize_t n = vi.len / 8, n_pri = vp.len / 8;
    if (fanout < 2 || capacity < 1 || capacity > t.off[1] || (n_pri != n && n_pri != 1)) {
        PyErr_SetString(PyExc_ValueError, "_sumtree.update: inconsistent arguments");
        goto fail;
    }
    const int64_t *idx = (const int64_t *)vi.buf;
    const double *pri = (const double *)vp.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= capacity) {
            status = ST_BAD_INDEX;
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n_pri; i++) {
        if (!isfinite(pri[i])) {
            status = ST_NOT_FINITE;
            goto done;
        }
        if (pri[i] < 0) {
            status = ST_NEGATIVE;
            goto done;
        }
    }
    if (n == 0) goto done;

    /* Allocate before writing anything: a failed allocation must leave the
     * tree as it was, not leaves whose sums were never propagated. */
    touched = PyMem_Malloc(sizeof(int64_t) * (size_t)n);
    if (touched == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    double *sums = (double *)t.sums.buf;
    double *mins = (double *)t.mins.buf;
    const int64_t *off = t.off;
    for (Py_ssize_t i = 0; i < n; i++) {
        double p = pri[n_pri == 1 ? 0 : i];
        sums[idx[i]] = p;
        mins[idx[i]] = p > 0 ? p : INFINITY;
    }
    /* Level by level: collect each distinct parent once (a NaN in the parent's
     * sum marks it as collected; it is overwritten before this function returns,
     * and the GIL is held throughout), then recompute it from its children. */
    const int64_t *nodes = idx;
    Py_ssize_t n_nodes = n;
    for (Py_ssize_t lvl = 0; lvl < t.depth; lvl++) {
        double *child_s = sums + off[lvl], *child_m = mins + off[lvl];
        double *par_s = sums + off[lvl + 1], *par_m = mins + off[lvl + 1];
        Py_ssize_t n_par = 0;
        for (Py_ssize_t i = 0; i < n_nodes; i++) {
            int64_t p = nodes[i] / fanout;
            if (!isnan(par_s[p])) {
                par_s[p] = NAN;
                touched[n_par++] = p;
            }
        }
        for (Py_ssize_t i = 0; i < n_par; i++) {
            int64_t p = touched[i];
            const double *cs = child_s + p * fanout, *cm = child_m + p * fanout;
            double s = cs[0], m = cm[0]; /* sequential sum, as NumPy's cumsum */
            for (Py_ssize_t j = 1; j < fanout; j++) {
                s += cs[j];
                m = cm[j] < m ? cm[j] : m;
            }
            par_s[p] = s;
            par_m[p] = m;
        }
        nodes = touched;
        n_nodes = n_par;
    }
done:
    PyMem_Free(touched);
    PyBuffer_Release(&vi);
    PyBuffer_Release(&vp);
    release_tree(&t);
    return PyLong_FromLong(status);
fail:
    PyMem_Free(touched);
    if (vi.obj) PyBuffer_Release(&vi);
    if (vp.obj) PyBuffer_Release(&vp);
    release_tree(&t);
    return NULL;
}

/* find(sums, offsets, fanout, mass, out) -> None
 *
 * `mass` (float64, overwritten as scratch) and `out` (int64) have the same
 * length. Descends all values one level at a time. Within a level, GROUP
 * values are walked together through their rows without branches (each row:
 * the number of prefix sums <= the value, and the last such prefix sum), so
 * the add chains of different values overlap; the rows of the next group are
 * prefetched. A fan-out of 8 (one cache line per row) is the fastest.
 */
static PyObject *
sumtree_find(PyObject *self, PyObject *args)
{
    PyObject *o_sums, *o_off, *o_mass, *o_out;
    Py_ssize_t fanout;
    if (!PyArg_ParseTuple(args, "OOnOO", &o_sums, &o_off, &fanout, &o_mass, &o_out)) {
        return NULL;
    }
    tree_views t;
    Py_buffer vm = {0}, vo = {0};
    if (get_tree(o_sums, NULL, o_off, fanout, 0, 0, &t) < 0) return NULL;
    if (get_buffer(o_mass, &vm, 1, 1) < 0) goto fail;
    if (get_buffer(o_out, &vo, 0, 1) < 0) goto fail;
    if (vm.len != vo.len || fanout < 2) {
        PyErr_SetString(PyExc_ValueError, "_sumtree.find: inconsistent arguments");
        goto fail;
    }
    if (!(((const double *)t.sums.buf)[t.off[t.depth]] > 0)) {
        /* Only nodes with positive mass are ever descended into, which keeps
         * every visited row inside the arrays: refuse an empty tree. */
        PyErr_SetString(PyExc_ValueError, "cannot sample from a SumTree whose total priority is 0");
        goto fail;
    }
    Py_ssize_t n = vm.len / 8;
    double *v = (double *)vm.buf;
    int64_t *node = (int64_t *)vo.buf;
    const double *sums = (const double *)t.sums.buf;
    const int64_t *off = t.off;
    const Py_ssize_t F = fanout;
    for (Py_ssize_t i = 0; i < n; i++) {
        node[i] = 0;
        if (v[i] < 0) v[i] = 0.0;
    }
    for (Py_ssize_t lvl = t.depth - 1; lvl >= 0; lvl--) {
        const double *level = sums + off[lvl];
        for (Py_ssize_t i0 = 0; i0 < n; i0 += GROUP) {
            if (i0 + 2 * GROUP <= n) {
                for (Py_ssize_t s = GROUP; s < 2 * GROUP; s++) {
                    const char *row = (const char *)(level + node[i0 + s] * F);
                    for (Py_ssize_t b = 0; b < F * 8; b += 64) __builtin_prefetch(row + b);
                }
            }
            const double *row[GROUP];
            double x[GROUP], acc[GROUP], pre[GROUP];
            Py_ssize_t cnt[GROUP];
            for (int s = 0; s < GROUP; s++) {
                /* A short last group repeats its last value (computed, not stored). */
                Py_ssize_t i = i0 + s < n ? i0 + s : n - 1;
                row[s] = level + node[i] * F;
                x[s] = v[i];
                acc[s] = row[s][0]; /* prefix sums as NumPy's cumsum: c0, c0 + c1, ... */
                cnt[s] = acc[s] <= x[s];
                pre[s] = cnt[s] ? acc[s] : 0.0;
            }
            for (Py_ssize_t k = 1; k < F; k++) {
                for (int s = 0; s < GROUP; s++) {
                    acc[s] += row[s][k];
                    int le = acc[s] <= x[s];
                    cnt[s] += le;
                    pre[s] = le ? acc[s] : pre[s];
                }
            }
            for (int s = 0; s < GROUP && i0 + s < n; s++) {
                const double *c = row[s];
                Py_ssize_t j = cnt[s];
                double prefix = pre[s];
                if (j >= F || !(c[j] > 0)) {
                    /* Rounding pushed the value past the last child with mass (or it
                     * is NaN): take the last child with positive mass. */
                    j = F - 1;
                    while (j > 0 && !(c[j] > 0)) j--;
                    if (!(c[j] > 0)) j = F - 1;
                    prefix = 0.0;
                    if (j > 0) {
                        prefix = c[0];
                        for (Py_ssize_t k = 1; k < j; k++) prefix += c[k];
                    }
                }
                v[i0 + s] = x[s] - prefix;
                node[i0 + s] = node[i0 + s] * F + j;
            }
        }
    }
    PyBuffer_Release(&vm);
    PyBuffer_Release(&vo);
    release_tree(&t);
    Py_RETURN_NONE;
fail:
    if (vm.obj) PyBuffer_Release(&vm);
    if (vo.obj) PyBuffer_Release(&vo);
    release_tree(&t);
    return NULL;
}

/* gather(leaves, capacity, indices, out) -> status: out[i] = leaves[indices[i]]. */
static PyObject *
sumtree_gather(PyObject *self, PyObject *args)
{
    PyObject *o_leaves, *o_idx, *o_out;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "OnOO", &o_leaves, &capacity, &o_idx, &o_out)) return NULL;
    Py_buffer vl = {0}, vi = {0}, vo = {0};
    long status = ST_OK;
    PyObject *result = NULL;
    if (get_buffer(o_leaves, &vl, 1, 0) < 0) goto out;
    if (get_buffer(o_idx, &vi, 0, 0) < 0) goto out;
    if (get_buffer(o_out, &vo, 1, 1) < 0) goto out;
    if (vi.len != vo.len || capacity > vl.len / 8) {
        PyErr_SetString(PyExc_ValueError, "_sumtree.gather: inconsistent arguments");
        goto out;
    }
    const double *leaves = (const double *)vl.buf;
    const int64_t *idx = (const int64_t *)vi.buf;
    double *dst = (double *)vo.buf;
    Py_ssize_t n = vi.len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= capacity) {
            status = ST_BAD_INDEX;
            break;
        }
        dst[i] = leaves[idx[i]];
    }
    result = PyLong_FromLong(status);
out:
    if (vl.obj) PyBuffer_Release(&vl);
    if (vi.obj) PyBuffer_Release(&vi);
    if (vo.obj) PyBuffer_Release(&vo);
    return result;
}

static PyMethodDef sumtree_methods[] = {
    {"update", sumtree_update, METH_VARARGS,
     "update(sums, mins, offsets, fanout, capacity, indices, priorities) -> status"},
    {"find", sumtree_find, METH_VARARGS, "find(sums, offsets, fanout, mass, out) -> None"},
    {"gather", sumtree_gather, METH_VARARGS, "gather(leaves, capacity, indices, out) -> status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sumtree_module = {
    PyModuleDef_HEAD_INIT,
    "_sumtree",
    "Compiled kernels for replaystore.sampling.SumTree (see sampling.py).",
    -1,
    sumtree_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__sumtree(void)
{
    return PyModule_Create(&sumtree_module);
}
