/* Exact BM25 top-k by document-at-a-time MaxScore, in C (the module docstring of
 * zsearch_cli/retrieval/maxscore.py says what is exact and why; this file is the loop).
 *
 * Index (bm25s's CSC impact arrays, memory-mapped): column t = term t, its passages
 * indices[indptr[t]..indptr[t+1]) ascending and each one's float32 contribution data[...];
 * term_max[t] = the largest contribution in column t.
 *
 * Reference score of passage d for query tokens q_1..q_n (query order, duplicates kept):
 * the float32 running sum ((0 + c(q_1,d)) + c(q_2,d)) + ..., c = 0 where d lacks the term.
 * Ranking: score descending, then lower row; only scores > 0 are hits.
 *
 * MaxScore (Turtle & Flood 1995), document at a time: unique terms sorted by bound
 * m_t * term_max[t] ascending (m_t: the term's multiplicity in the query); theta = the k-th
 * best score so far. Terms 0..e-1 whose bounds sum to at most theta are "non-essential": a
 * passage found only in their lists cannot beat theta, so candidates come from the essential
 * lists only. Each candidate's bound (its essential contributions plus the non-essential
 * bounds) is tightened list by list; it is scored exactly, in query order, only while the
 * bound can still beat theta. Passages arrive in ascending row order, so a later passage
 * that ties the k-th best loses the tie: a candidate must score strictly above theta.
 *
 * Bounds are summed in double and inflated by (1 + 1e-6 (n + 1)): a float32 sum of n
 * non-negative terms exceeds the exact sum by at most (1 + 2^-24)^n, so a pruned passage's
 * float32 score is at most theta. The GIL is released for the whole loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float score;
    int64_t row;
} Hit;

/* a is worse than b: lower score, or equal score and higher row */
static int worse(Hit a, Hit b) { return a.score < b.score || (a.score == b.score && a.row > b.row); }

static void sift_down(Hit *h, Py_ssize_t n, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && worse(h[l], h[w])) w = l;
        if (r < n && worse(h[r], h[w])) w = r;
        if (w == i) return;
        Hit t = h[i]; h[i] = h[w]; h[w] = t; i = w;
    }
}

static void sift_up(Hit *h, Py_ssize_t i) {
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!worse(h[i], h[p])) return;
        Hit t = h[i]; h[i] = h[p]; h[p] = t; i = p;
    }
}

static int best_first(const void *a, const void *b) {
    const Hit *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->row < y->row ? -1 : (x->row > y->row);
}

/* first position in [lo, hi) whose doc >= d (galloping, then binary search) */
static int64_t seek(const int32_t *indices, int64_t lo, int64_t hi, int32_t d) {
    int64_t step = 1, prev = lo;
    while (lo < hi && indices[lo] < d) {
        prev = lo;
        lo += step;
        step <<= 1;
    }
    if (lo > hi) lo = hi;
    int64_t a = prev, b = lo;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (indices[m] < d) a = m + 1; else b = m;
    }
    return a;
}

typedef struct {
    int64_t term, pos, end;
    Py_ssize_t uid; /* rank among the unique terms in ascending id order */
    double bound; /* m_t * term_max[t] */
    int mult;
    float c; /* contribution at the current candidate (0 = absent) */
} Cursor;

static int by_bound(const void *a, const void *b) {
    const Cursor *x = a, *y = b;
    if (x->bound != y->bound) return x->bound < y->bound ? -1 : 1;
    return x->term < y->term ? -1 : (x->term > y->term);
}

static int by_value(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : (x > y);
}

/* The loop. tokens: query term ids in query order; scratch: cur, slot, rank and sorted of
 * n_tokens entries, pre of n_tokens + 1. Returns the number of hits written to out, best first. */
static Py_ssize_t maxscore(const int64_t *indptr, const int32_t *indices, const float *data,
                           const float *term_max, const int64_t *tokens, Py_ssize_t n_tokens,
                           Py_ssize_t k, Hit *out, Cursor *cur, int *slot, int *rank, int64_t *sorted, double *pre) {
    /* unique terms (ascending, compacted into sorted[0..u)) and multiplicities: a sort,
     * O(n log n) for any query length */
    memcpy(sorted, tokens, sizeof(int64_t) * (size_t)n_tokens);
    qsort(sorted, (size_t)n_tokens, sizeof(int64_t), by_value);
    Py_ssize_t u = 0;
    for (Py_ssize_t j = 0; j < n_tokens; j++) {
        if (u > 0 && cur[u - 1].term == sorted[j]) { cur[u - 1].mult++; continue; }
        sorted[u] = sorted[j];
        cur[u].term = sorted[j];
        cur[u].uid = u;
        cur[u].pos = indptr[sorted[j]];
        cur[u].end = indptr[sorted[j] + 1];
        cur[u].mult = 1;
        u++;
    }
    for (Py_ssize_t s = 0; s < u; s++) cur[s].bound = (double)cur[s].mult * (double)term_max[cur[s].term];
    qsort(cur, (size_t)u, sizeof(Cursor), by_bound);
    for (Py_ssize_t s = 0; s < u; s++) rank[cur[s].uid] = (int)s;
    for (Py_ssize_t j = 0; j < n_tokens; j++) { /* each token's cursor: its term's rank */
        Py_ssize_t lo = 0, hi = u;
        while (lo < hi) {
            Py_ssize_t m = lo + (hi - lo) / 2;
            if (sorted[m] < tokens[j]) lo = m + 1; else hi = m;
        }
        slot[j] = rank[lo];
    }
    const double margin = 1.0 + 1e-6 * (double)(n_tokens + 1);
    pre[0] = 0.0; /* pre[i]: bound of terms 0..i-1 */
    for (Py_ssize_t s = 0; s < u; s++) pre[s + 1] = pre[s] + cur[s].bound;

    Py_ssize_t n = 0, e = 0; /* hits in the heap; first essential term */
    float theta = 0.0f;
    for (;;) {
        int32_t d = INT32_MAX;
        for (Py_ssize_t s = e; s < u; s++)
            if (cur[s].pos < cur[s].end && indices[cur[s].pos] < d) d = indices[cur[s].pos];
        if (d == INT32_MAX) break;
        double bound = pre[e];
        for (Py_ssize_t s = e; s < u; s++) {
            cur[s].c = 0.0f;
            if (cur[s].pos < cur[s].end && indices[cur[s].pos] == d) {
                cur[s].c = data[cur[s].pos++];
                bound += (double)cur[s].mult * (double)cur[s].c;
            }
        }
        int full = n == k;
        if (full && bound * margin <= (double)theta) continue;
        int pruned = 0;
        for (Py_ssize_t s = e - 1; s >= 0; s--) { /* tighten with the non-essential lists */
            cur[s].c = 0.0f;
            cur[s].pos = seek(indices, cur[s].pos, cur[s].end, d);
            bound -= cur[s].bound;
            if (cur[s].pos < cur[s].end && indices[cur[s].pos] == d) {
                cur[s].c = data[cur[s].pos];
                bound += (double)cur[s].mult * (double)cur[s].c;
            }
            if (full && bound * margin <= (double)theta) { pruned = 1; break; }
        }
        if (pruned) continue;
        float score = 0.0f;
        for (Py_ssize_t j = 0; j < n_tokens; j++) score += cur[slot[j]].c;
        if (!(score > 0.0f)) continue;
        Hit hit = {score, (int64_t)d};
        if (!full) {
            out[n] = hit;
            sift_up(out, n++);
        } else if (score > theta) {
            out[0] = hit;
            sift_down(out, n, 0);
        } else {
            continue;
        }
        if (n == k) {
            theta = out[0].score;
            while (e < u && pre[e + 1] * margin <= (double)theta) e++;
        }
    }
    qsort(out, (size_t)n, sizeof(Hit), best_first);
    return n;
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", name, itemsize);
        return -1;
    }
    return 0;
}

/* top_k_batch(indptr int64, indices int32, data float32, term_max float32, tokens int64 (all
 *             queries' tokens, concatenated), offsets int64[q + 1] (query i = tokens[offsets[i]
 *             .. offsets[i+1])), k, out_scores float32[q * k], out_rows int64[q * k],
 *             out_counts int64[q]) -> None
 * Query i's hits go to out_*[i * k ..], best first, and their number to out_counts[i]; a
 * query of no token gets 0 hits. Why a batch: one call, and one release of the GIL, for a
 * whole chunk of queries, so a thread pool that hands each thread a chunk scales with the
 * cores instead of paying per query for the call and the GIL hand-over (one call per query
 * made 2 threads slower than 1 on small indexes). One query is a batch of one. */
static PyObject *top_k_batch(PyObject *self, PyObject *args) {
    PyObject *o[9];
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OOOOOOnOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &k, &o[6], &o[7], &o[8]))
        return NULL;
    static const Py_ssize_t size[9] = {8, 4, 4, 4, 8, 8, 4, 8, 8};
    static const char *names[9] = {"indptr", "indices", "data", "term_max", "tokens", "offsets",
                                   "out_scores", "out_rows", "out_counts"};
    Py_buffer b[9];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 9; got++)
        if (get_buffer(o[got], &b[got], size[got], names[got]) < 0) goto done;
    Py_ssize_t n_queries = b[5].len / 8 - 1, n_all = b[4].len / 8;
    if (k < 1 || n_queries < 0 || b[6].len / 4 < n_queries * k || b[7].len / 8 < n_queries * k ||
        b[8].len / 8 < n_queries || b[6].readonly || b[7].readonly || b[8].readonly) {
        PyErr_SetString(PyExc_ValueError, "top_k_batch: k >= 1 and writable outputs of queries * k entries");
        goto done;
    }
    Py_ssize_t n_terms = b[0].len / 8 - 1;
    const int64_t *tokens = b[4].buf, *offsets = b[5].buf;
    Py_ssize_t longest = 1;
    for (Py_ssize_t i = 0; i < n_queries; i++) {
        if (offsets[i] < 0 || offsets[i] > offsets[i + 1] || offsets[i + 1] > n_all) {
            PyErr_Format(PyExc_ValueError, "top_k_batch: offsets[%zd..%zd] out of order or past %zd tokens",
                         i, i + 1, n_all);
            goto done;
        }
        if (offsets[i + 1] - offsets[i] > longest) longest = (Py_ssize_t)(offsets[i + 1] - offsets[i]);
    }
    for (Py_ssize_t j = 0; j < n_all; j++)
        if (tokens[j] < 0 || tokens[j] >= n_terms || tokens[j] >= b[3].len / 4) {
            PyErr_Format(PyExc_IndexError, "top_k_batch: token %lld outside the index's %zd terms",
                         (long long)tokens[j], n_terms);
            goto done;
        }
    size_t nt = (size_t)longest;
    Hit *heap = malloc(sizeof(Hit) * (size_t)k);
    Cursor *cur = malloc(sizeof(Cursor) * nt);
    int *slot = malloc(sizeof(int) * nt), *rank = malloc(sizeof(int) * nt);
    int64_t *sorted = malloc(sizeof(int64_t) * nt);
    double *pre = malloc(sizeof(double) * (nt + 1));
    if (!heap || !cur || !slot || !rank || !sorted || !pre) {
        free(heap); free(cur); free(slot); free(rank); free(sorted); free(pre);
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_queries; i++) {
        Py_ssize_t n_tokens = (Py_ssize_t)(offsets[i + 1] - offsets[i]), n = 0;
        if (n_tokens > 0)
            n = maxscore(b[0].buf, b[1].buf, b[2].buf, b[3].buf, tokens + offsets[i], n_tokens, k, heap, cur,
                         slot, rank, sorted, pre);
        float *scores = (float *)b[6].buf + i * k;
        int64_t *rows = (int64_t *)b[7].buf + i * k;
        for (Py_ssize_t h = 0; h < n; h++) {
            scores[h] = heap[h].score;
            rows[h] = heap[h].row;
        }
        ((int64_t *)b[8].buf)[i] = n;
    }
    Py_END_ALLOW_THREADS
    free(heap); free(cur); free(slot); free(rank); free(sorted); free(pre);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"top_k_batch", top_k_batch, METH_VARARGS,
     "Exact BM25 top-k by MaxScore for a batch of queries; see zsearch_cli/retrieval/maxscore.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maxscore", NULL, -1, methods};

PyMODINIT_FUNC PyInit__maxscore(void) { return PyModule_Create(&module); }
