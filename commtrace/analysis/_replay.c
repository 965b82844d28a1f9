/* The replay of commtrace.analysis.replay as a discrete-event loop in C (optional: the numpy
 * path in replay.py does the same, in batches, when this extension is not built).
 *
 * replay(rank_lo, rank_hi, gap, dur, rho, anchor, ev_slot, call_slot,
 *        sl_comm, sl_dep, tc, tc_ind, sl_prev, mask, cm_lo, cm_hi, succ_lo, succ, queue) -> rel
 *
 * Each rank advances through its host events until an event waits for a communication that
 * has not completed; a communication completes once all its members arrived and the
 * collectives it queues behind completed. All arrays are C-contiguous; int64 indices, float64
 * times, uint8 flags. Returns a bytes object holding E float64 releases, or raises
 * RuntimeError when the dependencies cannot all be met (the caller falls back to numpy).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { Py_buffer b; } Buf;

static int get(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (b->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: bad buffer size", name);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

#define NB 18

static PyObject *replay(PyObject *self, PyObject *args) {
    PyObject *objs[NB];
    int queue = 1;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOp", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &objs[7], &objs[8], &objs[9], &objs[10], &objs[11], &objs[12],
                          &objs[13], &objs[14], &objs[15], &objs[16], &objs[17], &queue))
        return NULL;
    static const Py_ssize_t sizes[NB] = {8, 8, 8, 8, 8, 1, 8, 8, 8, 1, 8, 8, 8, 1, 8, 8, 8, 8};
    static const char *names[NB] = {"rank_lo", "rank_hi", "gap", "dur", "rho", "anchor", "ev_slot", "call_slot",
                                    "sl_comm", "sl_dep", "tc", "tc_ind", "sl_prev", "mask", "cm_lo", "cm_hi",
                                    "succ_lo", "succ"};
    Py_buffer b[NB];
    int nb = 0;
    for (; nb < NB; nb++)
        if (get(objs[nb], &b[nb], sizes[nb], names[nb]) < 0) goto fail_bufs;

    const int64_t *rank_lo = b[0].buf, *rank_hi = b[1].buf;
    const double *gap = b[2].buf, *dur = b[3].buf, *rho = b[4].buf;
    const uint8_t *anchor = b[5].buf;
    const int64_t *ev_slot = b[6].buf, *call_slot = b[7].buf, *sl_comm = b[8].buf;
    const uint8_t *sl_dep = b[9].buf;
    const double *tc = b[10].buf, *tc_ind = b[11].buf;
    const int64_t *sl_prev = b[12].buf;
    const uint8_t *mask = b[13].buf;
    const int64_t *cm_lo = b[14].buf, *cm_hi = b[15].buf, *succ_lo = b[16].buf, *succ = b[17].buf;
    Py_ssize_t R = b[0].len / 8, E = b[2].len / 8, S = b[8].len / 8, C = b[14].len / 8;

    PyObject *out = PyBytes_FromStringAndSize(NULL, E * (Py_ssize_t)sizeof(double));
    if (!out) goto fail_bufs;
    double *rel = (double *)PyBytes_AS_STRING(out);
    int64_t *pos = malloc(sizeof(int64_t) * (R + 1));
    double *prev = malloc(sizeof(double) * (R + 1));
    int64_t *stack = malloc(sizeof(int64_t) * (R + 1));
    int64_t *next_waiter = malloc(sizeof(int64_t) * (R + 1));
    int64_t *head = malloc(sizeof(int64_t) * (C + 1));
    int64_t *arrived = calloc(C + 1, sizeof(int64_t));
    uint8_t *resolved = calloc(C + 1, 1);
    uint8_t *entered = calloc(S + 1, 1);
    double *enter = malloc(sizeof(double) * (S + 1));
    double *L = malloc(sizeof(double) * (S + 1));
    int64_t *cstack = malloc(sizeof(int64_t) * (C + b[17].len / 8 + 1));
    if (!pos || !prev || !stack || !next_waiter || !head || !arrived || !resolved || !entered || !enter || !L || !cstack) {
        PyErr_NoMemory();
        goto fail_all;
    }
    Py_ssize_t sp = 0, csp = 0, done_ranks = 0;
    for (Py_ssize_t c = 0; c < C; c++) head[c] = -1;
    for (Py_ssize_t r = 0; r < R; r++) {
        pos[r] = rank_lo[r];
        prev[r] = 0.0;
        stack[sp++] = r;
    }
    Py_BEGIN_ALLOW_THREADS
    while (sp > 0) {
        int64_t r = stack[--sp];
        while (pos[r] < rank_hi[r]) {
            int64_t e = pos[r];
            double start = prev[r] + gap[e];
            int64_t cs = call_slot[e];
            if (cs >= 0 && !entered[cs]) {
                entered[cs] = 1;
                enter[cs] = start;
                int64_t c = sl_comm[cs];
                arrived[c]++;
                if (arrived[c] == cm_hi[c] - cm_lo[c]) cstack[csp++] = c;
                /* resolve every communication that became ready (and those queued behind) */
                while (csp > 0) {
                    int64_t x = cstack[--csp];
                    if (resolved[x] || arrived[x] != cm_hi[x] - cm_lo[x]) continue;
                    int ready = 1;
                    for (int64_t s = cm_lo[x]; s < cm_hi[x] && ready; s++) {
                        int64_t p = sl_prev[s];
                        if (p >= 0 && !resolved[sl_comm[p]]) ready = 0;
                    }
                    if (!ready) continue;  /* retried when the one it queues behind resolves */
                    double T0 = -INFINITY;
                    for (int64_t s = cm_lo[x]; s < cm_hi[x]; s++) {
                        if (mask[s]) continue;
                        if (enter[s] > T0) T0 = enter[s];
                        int64_t p = sl_prev[s];
                        if (queue && p >= 0 && L[p] > T0) T0 = L[p];
                    }
                    for (int64_t s = cm_lo[x]; s < cm_hi[x]; s++) {
                        double t = T0 > enter[s] ? T0 : enter[s];
                        L[s] = sl_dep[s] ? t + tc[s] : enter[s] + tc_ind[s];
                    }
                    resolved[x] = 1;
                    for (int64_t w = head[x]; w >= 0; w = next_waiter[w]) stack[sp++] = w;
                    head[x] = -1;
                    for (int64_t k = succ_lo[x]; k < succ_lo[x + 1]; k++) cstack[csp++] = succ[k];
                }
            }
            double rl;
            if (anchor[e]) {
                int64_t s = ev_slot[e];
                int64_t c = sl_comm[s];
                if (!resolved[c]) {
                    next_waiter[r] = head[c];
                    head[c] = r;
                    goto blocked;
                }
                rl = (start > L[s] ? start : L[s]) + rho[e];
            } else {
                rl = start + dur[e];
            }
            rel[e] = rl;
            prev[r] = rl;
            pos[r]++;
        }
        done_ranks++;
    blocked:;
    }
    Py_END_ALLOW_THREADS
    if (done_ranks != R) {
        PyErr_SetString(PyExc_RuntimeError, "replay: dependencies cannot all be met (a cycle in the trace)");
        goto fail_all;
    }
    free(pos); free(prev); free(stack); free(next_waiter); free(head); free(arrived); free(resolved);
    free(entered); free(enter); free(L); free(cstack);
    for (int i = 0; i < NB; i++) PyBuffer_Release(&b[i]);
    return out;
fail_all:
    free(pos); free(prev); free(stack); free(next_waiter); free(head); free(arrived); free(resolved);
    free(entered); free(enter); free(L); free(cstack);
    Py_XDECREF(out);
    for (int i = 0; i < NB; i++) PyBuffer_Release(&b[i]);
    return NULL;
fail_bufs:
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return NULL;
}

/* replay_many(rank_lo, rank_hi, dur, rho, anchor, ev_slot, call_slot, sl_comm, sl_dep, sl_prev,
 *             cm_lo, cm_hi, succ_lo, succ, ev_step, n_steps,
 *             gaps, tcs, tc_inds, masks, queues, excls, kept) -> (t_end, step_end)
 *
 * The replay of S scenarios in one pass. Which event waits for which communication, and so the
 * order in which the loop above visits events and resolves communications, depends only on the
 * trace's structure, never on the times: every scenario takes the same path, so the path is
 * walked once and each step computes all S scenarios' times (kept side by side per slot and
 * rank). gaps/tcs/tc_inds/masks/excls: sequences of S buffers (E, S, S float64; S uint8; R uint8
 * per scenario); queues: sequence of S bools; ev_step: per event its step's position in
 * 0..n_steps-1 or -1. Per scenario, t_end is the latest release on the ranks not excluded (0
 * when none) and step_end[s, k] the latest release of step k's events (-inf when none); NaN
 * propagates as numpy's max does. kept: None, or a writable (S, E) float64 buffer that receives
 * every release. Raises RuntimeError as replay() does. */
#define MAXS 64

static int seq_bufs(PyObject *seq, Py_ssize_t S, Py_buffer *out, int *nout, Py_ssize_t itemsize, const char *name) {
    PyObject *f = PySequence_Fast(seq, name);
    if (!f) return -1;
    if (PySequence_Fast_GET_SIZE(f) != S) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd buffers", name, S);
        Py_DECREF(f);
        return -1;
    }
    for (Py_ssize_t i = 0; i < S; i++) {
        if (get(PySequence_Fast_GET_ITEM(f, i), &out[i], itemsize, name) < 0) {
            Py_DECREF(f);
            return -1;
        }
        (*nout)++;
    }
    Py_DECREF(f);
    return 0;
}

#define NB2 15

static PyObject *replay_many(PyObject *self, PyObject *args) {
    PyObject *objs[NB2], *o_gaps, *o_tcs, *o_tcis, *o_masks, *o_queues, *o_excls, *o_kept;
    Py_ssize_t n_steps;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOnOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &objs[7], &objs[8], &objs[9], &objs[10], &objs[11], &objs[12],
                          &objs[13], &objs[14], &n_steps, &o_gaps, &o_tcs, &o_tcis, &o_masks, &o_queues, &o_excls,
                          &o_kept))
        return NULL;
    static const Py_ssize_t sizes[NB2] = {8, 8, 8, 8, 1, 8, 8, 8, 1, 8, 8, 8, 8, 8, 8};
    static const char *names[NB2] = {"rank_lo", "rank_hi", "dur", "rho", "anchor", "ev_slot", "call_slot",
                                     "sl_comm", "sl_dep", "sl_prev", "cm_lo", "cm_hi", "succ_lo", "succ", "ev_step"};
    Py_ssize_t S = PySequence_Size(o_queues);
    if (S < 0) return NULL;
    if (S < 1 || S > MAXS) {
        PyErr_Format(PyExc_ValueError, "replay_many: 1 to %d scenarios", MAXS);
        return NULL;
    }
    Py_buffer b[NB2], gb[MAXS], tb[MAXS], ib[MAXS], mb[MAXS], xb[MAXS], kb;
    int nb = 0, ng = 0, nt = 0, ni = 0, nm = 0, nx = 0, nk = 0;
    int queue[MAXS];
    PyObject *res = NULL, *o_tend = NULL, *o_se = NULL;
    int64_t *pos = NULL, *stack = NULL, *next_waiter = NULL, *head = NULL, *arrived = NULL, *cstack = NULL;
    uint8_t *resolved = NULL, *entered = NULL;
    double *prev = NULL, *enter = NULL, *L = NULL, *start = NULL, *T0 = NULL;
    for (; nb < NB2; nb++)
        if (get(objs[nb], &b[nb], sizes[nb], names[nb]) < 0) goto done;
    for (Py_ssize_t s = 0; s < S; s++) {
        PyObject *q = PySequence_GetItem(o_queues, s);
        if (!q) goto done;
        queue[s] = PyObject_IsTrue(q);
        Py_DECREF(q);
        if (queue[s] < 0) goto done;
    }
    if (seq_bufs(o_gaps, S, gb, &ng, 8, "gaps") < 0 || seq_bufs(o_tcs, S, tb, &nt, 8, "tcs") < 0 ||
        seq_bufs(o_tcis, S, ib, &ni, 8, "tc_inds") < 0 || seq_bufs(o_masks, S, mb, &nm, 1, "masks") < 0 ||
        seq_bufs(o_excls, S, xb, &nx, 1, "excls") < 0)
        goto done;
    const int64_t *rank_lo = b[0].buf, *rank_hi = b[1].buf;
    const double *dur = b[2].buf, *rho = b[3].buf;
    const uint8_t *anchor = b[4].buf;
    const int64_t *ev_slot = b[5].buf, *call_slot = b[6].buf, *sl_comm = b[7].buf;
    const uint8_t *sl_dep = b[8].buf;
    const int64_t *sl_prev = b[9].buf, *cm_lo = b[10].buf, *cm_hi = b[11].buf, *succ_lo = b[12].buf, *succ = b[13].buf;
    const int64_t *ev_step = b[14].buf;
    Py_ssize_t R = b[0].len / 8, E = b[2].len / 8, NS = b[7].len / 8, C = b[10].len / 8;
    const double *gap[MAXS], *tc[MAXS], *tci[MAXS];
    const uint8_t *mask[MAXS], *excl[MAXS];
    for (Py_ssize_t s = 0; s < S; s++) {
        if (gb[s].len != E * 8 || tb[s].len != NS * 8 || ib[s].len != NS * 8 || mb[s].len != NS || xb[s].len != R) {
            PyErr_SetString(PyExc_ValueError, "replay_many: scenario buffer of the wrong size");
            goto done;
        }
        gap[s] = gb[s].buf; tc[s] = tb[s].buf; tci[s] = ib[s].buf; mask[s] = mb[s].buf; excl[s] = xb[s].buf;
    }
    double *kept = NULL;
    if (o_kept != Py_None) {
        if (PyObject_GetBuffer(o_kept, &kb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
        nk = 1;
        if (kb.len != S * E * 8) {
            PyErr_SetString(PyExc_ValueError, "replay_many: kept has the wrong size");
            goto done;
        }
        kept = kb.buf;
    }
    o_tend = PyBytes_FromStringAndSize(NULL, S * (Py_ssize_t)sizeof(double));
    o_se = PyBytes_FromStringAndSize(NULL, S * (n_steps > 0 ? n_steps : 0) * (Py_ssize_t)sizeof(double));
    if (!o_tend || !o_se) goto done;
    double *tend = (double *)PyBytes_AS_STRING(o_tend), *se = (double *)PyBytes_AS_STRING(o_se);
    unsigned char any_end[MAXS];
    for (Py_ssize_t s = 0; s < S; s++) { tend[s] = 0.0; any_end[s] = 0; }
    for (Py_ssize_t k = 0; k < S * n_steps; k++) se[k] = -INFINITY;
    pos = malloc(sizeof(int64_t) * (R + 1));
    prev = malloc(sizeof(double) * (R + 1) * S);
    stack = malloc(sizeof(int64_t) * (R + 1));
    next_waiter = malloc(sizeof(int64_t) * (R + 1));
    head = malloc(sizeof(int64_t) * (C + 1));
    arrived = calloc(C + 1, sizeof(int64_t));
    resolved = calloc(C + 1, 1);
    entered = calloc(NS + 1, 1);
    enter = malloc(sizeof(double) * (NS + 1) * S);
    L = malloc(sizeof(double) * (NS + 1) * S);
    cstack = malloc(sizeof(int64_t) * (C + b[13].len / 8 + 1));
    start = malloc(sizeof(double) * S);
    T0 = malloc(sizeof(double) * S);
    if (!pos || !prev || !stack || !next_waiter || !head || !arrived || !resolved || !entered || !enter || !L ||
        !cstack || !start || !T0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t sp = 0, csp = 0, done_ranks = 0;
    for (Py_ssize_t c = 0; c < C; c++) head[c] = -1;
    for (Py_ssize_t r = 0; r < R; r++) {
        pos[r] = rank_lo[r];
        for (Py_ssize_t s = 0; s < S; s++) prev[r * S + s] = 0.0;
        stack[sp++] = r;
    }
    Py_BEGIN_ALLOW_THREADS
    while (sp > 0) {
        int64_t r = stack[--sp];
        double *pv = prev + r * S;
        while (pos[r] < rank_hi[r]) {
            int64_t e = pos[r];
            for (Py_ssize_t s = 0; s < S; s++) start[s] = pv[s] + gap[s][e];
            int64_t cs = call_slot[e];
            if (cs >= 0 && !entered[cs]) {
                entered[cs] = 1;
                memcpy(enter + cs * S, start, sizeof(double) * S);
                int64_t c = sl_comm[cs];
                arrived[c]++;
                if (arrived[c] == cm_hi[c] - cm_lo[c]) cstack[csp++] = c;
                while (csp > 0) {
                    int64_t x = cstack[--csp];
                    if (resolved[x] || arrived[x] != cm_hi[x] - cm_lo[x]) continue;
                    int ready = 1;
                    for (int64_t j = cm_lo[x]; j < cm_hi[x] && ready; j++) {
                        int64_t p = sl_prev[j];
                        if (p >= 0 && !resolved[sl_comm[p]]) ready = 0;
                    }
                    if (!ready) continue;
                    for (Py_ssize_t s = 0; s < S; s++) T0[s] = -INFINITY;
                    for (int64_t j = cm_lo[x]; j < cm_hi[x]; j++) {
                        const double *en = enter + j * S;
                        int64_t p = sl_prev[j];
                        const double *lp = p >= 0 ? L + p * S : NULL;
                        for (Py_ssize_t s = 0; s < S; s++) {
                            if (mask[s][j]) continue;
                            if (en[s] > T0[s]) T0[s] = en[s];
                            if (queue[s] && lp && lp[s] > T0[s]) T0[s] = lp[s];
                        }
                    }
                    for (int64_t j = cm_lo[x]; j < cm_hi[x]; j++) {
                        const double *en = enter + j * S;
                        double *lj = L + j * S;
                        if (sl_dep[j]) {
                            for (Py_ssize_t s = 0; s < S; s++) {
                                double t = T0[s] > en[s] ? T0[s] : en[s];
                                lj[s] = t + tc[s][j];
                            }
                        } else {
                            for (Py_ssize_t s = 0; s < S; s++) lj[s] = en[s] + tci[s][j];
                        }
                    }
                    resolved[x] = 1;
                    for (int64_t w = head[x]; w >= 0; w = next_waiter[w]) stack[sp++] = w;
                    head[x] = -1;
                    for (int64_t k = succ_lo[x]; k < succ_lo[x + 1]; k++) cstack[csp++] = succ[k];
                }
            }
            if (anchor[e]) {
                int64_t sl = ev_slot[e];
                if (!resolved[sl_comm[sl]]) {
                    next_waiter[r] = head[sl_comm[sl]];
                    head[sl_comm[sl]] = r;
                    goto blocked;
                }
                const double *ls = L + sl * S;
                for (Py_ssize_t s = 0; s < S; s++) pv[s] = (start[s] > ls[s] ? start[s] : ls[s]) + rho[e];
            } else {
                for (Py_ssize_t s = 0; s < S; s++) pv[s] = start[s] + dur[e];
            }
            int64_t k = ev_step[e];
            for (Py_ssize_t s = 0; s < S; s++) {
                double v = pv[s];
                if (!excl[s][r]) {
                    if (!any_end[s]) { tend[s] = v; any_end[s] = 1; }
                    else if (v > tend[s] || isnan(v)) { if (!isnan(tend[s])) tend[s] = v; }
                }
                if (k >= 0) {
                    double *q = se + s * n_steps + k;
                    if ((v > *q || isnan(v)) && !isnan(*q)) *q = v;
                }
                if (kept) kept[s * E + e] = v;
            }
            pos[r]++;
        }
        done_ranks++;
    blocked:;
    }
    Py_END_ALLOW_THREADS
    if (done_ranks != R) {
        PyErr_SetString(PyExc_RuntimeError, "replay: dependencies cannot all be met (a cycle in the trace)");
        goto done;
    }
    res = PyTuple_Pack(2, o_tend, o_se);
done:
    free(pos); free(prev); free(stack); free(next_waiter); free(head); free(arrived); free(resolved);
    free(entered); free(enter); free(L); free(cstack); free(start); free(T0);
    Py_XDECREF(o_tend); Py_XDECREF(o_se);
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    for (int i = 0; i < ng; i++) PyBuffer_Release(&gb[i]);
    for (int i = 0; i < nt; i++) PyBuffer_Release(&tb[i]);
    for (int i = 0; i < ni; i++) PyBuffer_Release(&ib[i]);
    for (int i = 0; i < nm; i++) PyBuffer_Release(&mb[i]);
    for (int i = 0; i < nx; i++) PyBuffer_Release(&xb[i]);
    if (nk) PyBuffer_Release(&kb);
    return res;
}

/* median_excess(g, group, ngroups) -> (ex, has_peers)
 *
 * The arithmetic of model._median_sorted without the global sort: per element i with group[i]
 * in 0..ngroups-1 and g[i] not NaN, ex[i] = max(0, g[i] - median of the other non-NaN values of
 * its group) and has_peers[i] = 1 when there is such another value (else 0, 0; NaN values and
 * group -1 give 0, 0). The median of an even count is 0.5 * (lower + upper), as numpy computes
 * it there. Groups are gathered by a counting sort, each sorted by value. */
typedef struct { double v; int64_t i; } VI;

static void sort_vi(VI *a, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) {
        VI x = a[i];
        Py_ssize_t j = i;
        while (j > 0 && a[j - 1].v > x.v) { a[j] = a[j - 1]; j--; }
        a[j] = x;
    }
}

static int cmp_vi(const void *x, const void *y) {
    double a = ((const VI *)x)->v, b = ((const VI *)y)->v;
    return a < b ? -1 : (a > b ? 1 : 0);
}

static PyObject *median_excess(PyObject *self, PyObject *args) {
    PyObject *og, *ogr;
    Py_ssize_t G;
    if (!PyArg_ParseTuple(args, "OOn", &og, &ogr, &G)) return NULL;
    Py_buffer bg, bgr;
    if (get(og, &bg, 8, "g") < 0) return NULL;
    if (get(ogr, &bgr, 8, "group") < 0) { PyBuffer_Release(&bg); return NULL; }
    PyObject *res = NULL, *oex = NULL, *ohp = NULL;
    Py_ssize_t n = bg.len / 8;
    int64_t *cnt = NULL;
    VI *buf = NULL;
    if (bgr.len / 8 != n || G < 0) {
        PyErr_SetString(PyExc_ValueError, "median_excess: bad sizes");
        goto done;
    }
    const double *g = bg.buf;
    const int64_t *grp = bgr.buf;
    oex = PyBytes_FromStringAndSize(NULL, n * 8);
    ohp = PyBytes_FromStringAndSize(NULL, n);
    cnt = calloc(G + 2, sizeof(int64_t));
    buf = malloc(sizeof(VI) * (n + 1));
    if (!oex || !ohp || !cnt || !buf) { PyErr_NoMemory(); goto done; }
    double *ex = (double *)PyBytes_AS_STRING(oex);
    uint8_t *hp = (uint8_t *)PyBytes_AS_STRING(ohp);
    for (Py_ssize_t i = 0; i < n; i++) {
        ex[i] = 0.0;
        hp[i] = 0;
        int64_t k = grp[i];
        if (k >= G) { PyErr_SetString(PyExc_ValueError, "median_excess: group out of range"); goto done; }
        if (k >= 0 && !isnan(g[i])) cnt[k + 1]++;
    }
    for (Py_ssize_t k = 0; k < G; k++) cnt[k + 1] += cnt[k];
    Py_BEGIN_ALLOW_THREADS
    {
        int64_t *at = malloc(sizeof(int64_t) * (G + 1));
        if (at) {
            memcpy(at, cnt, sizeof(int64_t) * (G + 1));
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t k = grp[i];
                if (k >= 0 && !isnan(g[i])) { buf[at[k]].v = g[i]; buf[at[k]].i = i; at[k]++; }
            }
            free(at);
            for (Py_ssize_t k = 0; k < G; k++) {
                VI *a = buf + cnt[k];
                Py_ssize_t c = cnt[k + 1] - cnt[k];
                if (c < 2) continue;
                if (c <= 48) sort_vi(a, c); else qsort(a, c, sizeof(VI), cmp_vi);
                Py_ssize_t m = c - 1, half = m / 2;
                for (Py_ssize_t p = 0; p < c; p++) {
                    /* the others' j-th value skips position p */
                    double hi = a[half >= p ? half + 1 : half].v, med;
                    if (m % 2 == 1) med = hi;
                    else {
                        Py_ssize_t j = half - 1;
                        med = 0.5 * (a[j >= p ? j + 1 : j].v + hi);
                    }
                    double d = a[p].v - med;
                    ex[a[p].i] = 0.0 >= d ? 0.0 : d;
                    hp[a[p].i] = 1;
                }
            }
        } else {
            cnt[0] = -1;
        }
    }
    Py_END_ALLOW_THREADS
    if (cnt[0] < 0) { PyErr_NoMemory(); goto done; }
    res = PyTuple_Pack(2, oex, ohp);
done:
    free(cnt); free(buf);
    Py_XDECREF(oex); Py_XDECREF(ohp);
    PyBuffer_Release(&bg); PyBuffer_Release(&bgr);
    return res;
}

static PyMethodDef methods[] = {
    {"median_excess", median_excess, METH_VARARGS, "Excess over the median of the others in a group (model.py)."},
    {"replay", replay, METH_VARARGS, "Replay the host model (see commtrace/analysis/replay.py)."},
    {"replay_many", replay_many, METH_VARARGS, "Replay several scenarios in one pass (see replay.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replay", NULL, -1, methods};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
