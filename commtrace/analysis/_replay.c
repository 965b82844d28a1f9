/* The C helpers of root cause and what-if (commtrace/analysis: replay.py and model.py); optional,
 * as numpy does the same without them. First the replay of commtrace.analysis.replay as a
 * discrete-event loop (the numpy
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

/* a hint to fetch the cache line of p ahead of a random read (w 0) or write (w 1) */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p, w) __builtin_prefetch((p), (w), 1)
#else
#define PREFETCH(p, w) ((void)0)
#endif

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
 *             gaps, tcs, tc_inds, masks, queues, excls, kept, gap_ats, gap_tos[, packed, packed_gap])
 *   -> (t_end, step_end)
 *
 * packed: None, or the EvP records of these arrays (replay.py _packed_events: the gaps those of
 * gaps[0] when packed_gap is true, else read from gaps); without them the pass packs its own.
 *
 * The replay of S scenarios in one pass. Which event waits for which communication, and so the
 * order in which the loop above visits events and resolves communications, depends only on the
 * trace's structure, never on the times: every scenario takes the same path, so the path is
 * walked once and each step computes all S scenarios' times (kept side by side per slot and
 * rank; a slot holds its entry until its communication resolves, then its release). A slot's S
 * times live in a row of a pool (`L`, rows reused) from its entry until the last of its readers
 * has read them: the anchor events that wait for it and its queue successor (the next slot on its
 * group and rank). Rows in use at once are the slots in flight, not every slot: 64 x 20,000 with
 * 8 scenarios, 317 rows (20 kB; plus two int32 per slot, row and readers) against the 82 MB of one
 * row per slot, in first-touch page faults (docs/performance.md, session 20). gaps/tcs/tc_inds/masks/excls: sequences of S buffers (E, S, S float64; S uint8; R uint8
 * per scenario); queues: sequence of S bools; ev_step: per event its step's position in
 * 0..n_steps-1 or -1. Per scenario, t_end is the latest release on the ranks not excluded (0
 * when none) and step_end[s, k] the latest release of step k's events (-inf when none); NaN
 * propagates as numpy's max does. kept: None, or a writable (S, E) float64 buffer that receives
 * every release. gap_ats / gap_tos: per scenario, increasing event indices whose gap is the
 * matching value instead of gaps[s]'s (a scenario that changes a few gaps shares the measured
 * array). Raises RuntimeError as replay() does. */
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

/* One event's inputs of replay_many's walk, packed in one 32-byte record (filled at the start of
 * each call): the walk moves from rank to rank at every blocking wait, and each resume read
 * the lines of six arrays (gap, call_slot, anchor, ev_slot, rho or dur, ev_step) where it now
 * reads one: 64 x 20,000, one scenario 0.096-0.101 -> 0.069 s a pass, nine 0.150-0.163 ->
 * 0.119 s, packing included (docs/performance.md, session 27). */
typedef struct {
    double gap;     /* the first scenario's gap (read when every scenario shares it) */
    double dr;      /* rho (anchor) or dur */
    int32_t cs;     /* call_slot, -1 none */
    int32_t sl;     /* ev_slot */
    int32_t step;   /* ev_step, -1 none */
    int32_t anchor;
} EvP;

static PyObject *replay_many(PyObject *self, PyObject *args) {
    PyObject *objs[NB2], *o_gaps, *o_tcs, *o_tcis, *o_masks, *o_queues, *o_excls, *o_kept, *o_ats, *o_tos;
    PyObject *o_packed = Py_None;
    int packed_gap = 0;
    Py_ssize_t n_steps;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOnOOOOOOOOO|Op", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &objs[7], &objs[8], &objs[9], &objs[10], &objs[11], &objs[12],
                          &objs[13], &objs[14], &n_steps, &o_gaps, &o_tcs, &o_tcis, &o_masks, &o_queues, &o_excls,
                          &o_kept, &o_ats, &o_tos, &o_packed, &packed_gap))
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
    Py_buffer b[NB2], gb[MAXS], tb[MAXS], ib[MAXS], mb[MAXS], xb[MAXS], ab[MAXS], vb[MAXS], kb, pb;
    int nb = 0, ng = 0, nt = 0, ni = 0, nm = 0, nx = 0, na = 0, nv = 0, nk = 0, npb = 0;
    int64_t *cur = NULL;
    int queue[MAXS];
    PyObject *res = NULL, *o_tend = NULL, *o_se = NULL;
    int64_t *pos = NULL, *stack = NULL, *next_waiter = NULL, *head = NULL, *arrived = NULL, *cstack = NULL;
    int64_t *nxt = NULL;
    uint8_t *resolved = NULL;
    int32_t *row = NULL, *nread = NULL, *freel = NULL;
    EvP *evp = NULL, *evp_own = NULL;
    double *prev = NULL, *L = NULL, *start = NULL, *T0 = NULL;
    Py_ssize_t cap = 0, used = 0, nfree = 0;
    int pool_err = 0;   /* 1: out of memory growing the pool; 2: a row read after its release */
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
        seq_bufs(o_excls, S, xb, &nx, 1, "excls") < 0 || seq_bufs(o_ats, S, ab, &na, 8, "gap_ats") < 0 ||
        seq_bufs(o_tos, S, vb, &nv, 8, "gap_tos") < 0)
        goto done;
    const int64_t *rank_lo = b[0].buf, *rank_hi = b[1].buf;
    const double *dur = b[2].buf, *rho = b[3].buf;
    const uint8_t *anchor = b[4].buf;
    const int64_t *ev_slot = b[5].buf, *call_slot = b[6].buf, *sl_comm = b[7].buf;
    const uint8_t *sl_dep = b[8].buf;
    const int64_t *sl_prev = b[9].buf, *cm_lo = b[10].buf, *cm_hi = b[11].buf, *succ_lo = b[12].buf, *succ = b[13].buf;
    const int64_t *ev_step = b[14].buf;
    Py_ssize_t R = b[0].len / 8, E = b[2].len / 8, NS = b[7].len / 8, C = b[10].len / 8;
    const double *gap[MAXS], *tc[MAXS], *tci[MAXS], *gto[MAXS];
    const int64_t *gat[MAXS];
    Py_ssize_t ngat[MAXS];
    const uint8_t *mask[MAXS], *excl[MAXS];
    for (Py_ssize_t s = 0; s < S; s++) {
        if (gb[s].len != E * 8 || tb[s].len != NS * 8 || ib[s].len != NS * 8 || mb[s].len != NS || xb[s].len != R) {
            PyErr_SetString(PyExc_ValueError, "replay_many: scenario buffer of the wrong size");
            goto done;
        }
        gap[s] = gb[s].buf; tc[s] = tb[s].buf; tci[s] = ib[s].buf; mask[s] = mb[s].buf; excl[s] = xb[s].buf;
        gat[s] = ab[s].buf; gto[s] = vb[s].buf; ngat[s] = ab[s].len / 8;
        if (vb[s].len / 8 != ngat[s]) {
            PyErr_SetString(PyExc_ValueError, "replay_many: gap_ats and gap_tos differ in length");
            goto done;
        }
        for (Py_ssize_t k = 0; k < ngat[s]; k++)
            if (gat[s][k] < 0 || gat[s][k] >= E || (k && gat[s][k] <= gat[s][k - 1])) {
                PyErr_SetString(PyExc_ValueError, "replay_many: gap_ats must be increasing event indices");
                goto done;
            }
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
    if (NS >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "replay_many: too many slots");
        goto done;
    }
    /* row[j]: slot j's row in L; -1 before its entry, -2 once released. nread[j]: its readers
     * still to come (anchor events waiting for it, its queue successor). */
    row = malloc(sizeof(int32_t) * (NS + 1));
    nread = calloc(NS + 1, sizeof(int32_t));
    cap = NS < 1024 ? NS + 1 : 1024;
    L = malloc(sizeof(double) * cap * S);
    freel = malloc(sizeof(int32_t) * cap);
    cstack = malloc(sizeof(int64_t) * (C + b[13].len / 8 + 1));
    start = malloc(sizeof(double) * S);
    cur = malloc(sizeof(int64_t) * (R + 1) * S);
    T0 = malloc(sizeof(double) * S);
    if (!pos || !prev || !stack || !next_waiter || !head || !arrived || !resolved || !row || !nread || !L ||
        !freel || !cstack || !start || !T0 || !cur) {
        PyErr_NoMemory();
        goto done;
    }
    nxt = malloc(sizeof(int64_t) * (R + 1));
    if (!nxt) {
        PyErr_NoMemory();
        goto done;
    }
    if (E >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "replay_many: too many events");
        goto done;
    }
    if (o_packed != Py_None) {    /* pack_events' records of these arrays (replay.py caches them) */
        if (PyObject_GetBuffer(o_packed, &pb, PyBUF_C_CONTIGUOUS) < 0) goto done;
        npb = 1;
        if (pb.len != E * (Py_ssize_t)sizeof(EvP)) {
            PyErr_SetString(PyExc_ValueError, "replay_many: packed events of the wrong size");
            goto done;
        }
        evp = pb.buf;
    } else {
        evp = evp_own = malloc(sizeof(EvP) * (E + 1));
        if (!evp_own) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* The scenarios usually share one gap array (their changes are sparse overrides, gap_at /
     * gap_to): the gap is then read once per event, and the overrides only at the events that
     * have one, found by nxt[r], the rank's next override event in any scenario. */
    int same_gap = 1;
    for (Py_ssize_t s = 1; s < S; s++)
        if (gap[s] != gap[0]) same_gap = 0;
    Py_ssize_t sp = 0, csp = 0, done_ranks = 0;
    for (Py_ssize_t c = 0; c < C; c++) head[c] = -1;
    for (Py_ssize_t j = 0; j < NS; j++) row[j] = -1;
    for (Py_ssize_t e = 0; e < E; e++)
        if (anchor[e] && ev_slot[e] >= 0 && ev_slot[e] < NS) nread[ev_slot[e]]++;
    for (Py_ssize_t j = 0; j < NS; j++)
        if (sl_prev[j] >= 0 && sl_prev[j] < NS) nread[sl_prev[j]]++;
    if (evp_own)
        for (Py_ssize_t e = 0; e < E; e++) {
            EvP *p = evp_own + e;
            p->gap = gap[0][e];
            p->anchor = anchor[e] != 0;
            p->dr = p->anchor ? rho[e] : dur[e];
            p->cs = (int32_t)call_slot[e];
            p->sl = (int32_t)ev_slot[e];
            p->step = (int32_t)ev_step[e];
        }
    else if (!packed_gap)
        same_gap = 0;   /* (the records' gaps are not the scenarios': read gap[s]) */
    for (Py_ssize_t r = 0; r < R; r++) {
        pos[r] = rank_lo[r];
        nxt[r] = INT64_MAX;
        for (Py_ssize_t s = 0; s < S; s++) {
            prev[r * S + s] = 0.0;
            /* this rank's first gap override: the first index >= rank_lo[r] */
            Py_ssize_t lo = 0, hi = ngat[s];
            while (lo < hi) { Py_ssize_t mid = lo + (hi - lo) / 2; if (gat[s][mid] < rank_lo[r]) lo = mid + 1; else hi = mid; }
            cur[r * S + s] = lo;
            if (lo < ngat[s] && gat[s][lo] < nxt[r]) nxt[r] = gat[s][lo];
        }
        stack[sp++] = r;
    }
    Py_BEGIN_ALLOW_THREADS
    while (sp > 0) {
        int64_t r = stack[--sp];
        double *pv = prev + r * S;
        int64_t *cr = cur + r * S;
        uint8_t ex[MAXS];
        for (Py_ssize_t s = 0; s < S; s++) ex[s] = excl[s][r];
        while (pos[r] < rank_hi[r]) {
            int64_t e = pos[r];
            const EvP *ep = evp + e;
            if (same_gap) {
                double g = ep->gap;
                for (Py_ssize_t s = 0; s < S; s++) start[s] = pv[s] + g;
            } else {
                for (Py_ssize_t s = 0; s < S; s++) start[s] = pv[s] + gap[s][e];
            }
            if (e == nxt[r]) {
                for (Py_ssize_t s = 0; s < S; s++) {
                    int64_t k = cr[s];
                    if (k < ngat[s] && gat[s][k] == e) start[s] = pv[s] + gto[s][k];
                }
            }
            int64_t cs = ep->cs;
            if (cs >= 0 && row[cs] == -1) {
                int32_t rw;
                if (nfree) {
                    rw = freel[--nfree];
                } else {
                    if (used == cap) {
                        Py_ssize_t nc = cap * 2 < NS + 1 ? cap * 2 : NS + 1;
                        double *L2 = realloc(L, sizeof(double) * nc * S);
                        if (L2) L = L2;
                        int32_t *f2 = L2 ? realloc(freel, sizeof(int32_t) * nc) : NULL;
                        if (f2) freel = f2;
                        if (!L2 || !f2) { pool_err = 1; goto pool_fail; }
                        cap = nc;
                    }
                    rw = (int32_t)used++;
                }
                row[cs] = rw;
                memcpy(L + (Py_ssize_t)rw * S, start, sizeof(double) * S);   /* the entry, until resolved */
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
                        const double *en = L + (Py_ssize_t)row[j] * S;      /* entries (x unresolved) */
                        int64_t p = sl_prev[j];
                        if (p >= 0 && row[p] < 0) { pool_err = 2; goto pool_fail; }
                        const double *lp = p >= 0 ? L + (Py_ssize_t)row[p] * S : NULL;
                        for (Py_ssize_t s = 0; s < S; s++) {
                            if (mask[s][j]) continue;
                            if (en[s] > T0[s]) T0[s] = en[s];
                            if (queue[s] && lp && lp[s] > T0[s]) T0[s] = lp[s];
                        }
                    }
                    for (int64_t j = cm_lo[x]; j < cm_hi[x]; j++) {
                        double *lj = L + (Py_ssize_t)row[j] * S;            /* entry in, release out */
                        if (sl_dep[j]) {
                            for (Py_ssize_t s = 0; s < S; s++) {
                                double t = T0[s] > lj[s] ? T0[s] : lj[s];
                                lj[s] = t + tc[s][j];
                            }
                        } else {
                            for (Py_ssize_t s = 0; s < S; s++) lj[s] = lj[s] + tci[s][j];
                        }
                    }
                    resolved[x] = 1;
                    /* the queue predecessors are read; slots nobody else reads are released */
                    for (int64_t j = cm_lo[x]; j < cm_hi[x]; j++) {
                        int64_t p = sl_prev[j];
                        if (p >= 0 && --nread[p] == 0) { freel[nfree++] = row[p]; row[p] = -2; }
                        if (nread[j] == 0) { freel[nfree++] = row[j]; row[j] = -2; }
                    }
                    for (int64_t w = head[x]; w >= 0; w = next_waiter[w]) stack[sp++] = w;
                    head[x] = -1;
                    for (int64_t k = succ_lo[x]; k < succ_lo[x + 1]; k++) cstack[csp++] = succ[k];
                }
            }
            if (ep->anchor) {
                int64_t sl = ep->sl;
                if (!resolved[sl_comm[sl]]) {
                    next_waiter[r] = head[sl_comm[sl]];
                    head[sl_comm[sl]] = r;
                    goto blocked;
                }
                if (row[sl] < 0) { pool_err = 2; goto pool_fail; }
                const double *ls = L + (Py_ssize_t)row[sl] * S;
                double dr = ep->dr;
                for (Py_ssize_t s = 0; s < S; s++) pv[s] = (start[s] > ls[s] ? start[s] : ls[s]) + dr;
                if (--nread[sl] == 0) { freel[nfree++] = row[sl]; row[sl] = -2; }
            } else {
                double dr = ep->dr;
                for (Py_ssize_t s = 0; s < S; s++) pv[s] = start[s] + dr;
            }
            int64_t k = ep->step;
            for (Py_ssize_t s = 0; s < S; s++) {
                double v = pv[s];
                if (!ex[s]) {
                    if (!any_end[s]) { tend[s] = v; any_end[s] = 1; }
                    else if (v > tend[s] || isnan(v)) { if (!isnan(tend[s])) tend[s] = v; }
                }
                if (k >= 0) {
                    double *q = se + s * n_steps + k;
                    if ((v > *q || isnan(v)) && !isnan(*q)) *q = v;
                }
            }
            if (kept)
                for (Py_ssize_t s = 0; s < S; s++) kept[s * E + e] = pv[s];
            if (e == nxt[r]) {
                int64_t n2 = INT64_MAX;
                for (Py_ssize_t s = 0; s < S; s++) {
                    if (cr[s] < ngat[s] && gat[s][cr[s]] == e) cr[s]++;
                    if (cr[s] < ngat[s] && gat[s][cr[s]] < n2) n2 = gat[s][cr[s]];
                }
                nxt[r] = n2;
            }
            pos[r]++;
        }
        done_ranks++;
    blocked:;
    }
pool_fail:;
    Py_END_ALLOW_THREADS
    if (pool_err == 1) {
        PyErr_NoMemory();
        goto done;
    }
    if (pool_err == 2) {
        PyErr_SetString(PyExc_SystemError, "replay_many: a slot read after its release (commtrace bug)");
        goto done;
    }
    if (done_ranks != R) {
        PyErr_SetString(PyExc_RuntimeError, "replay: dependencies cannot all be met (a cycle in the trace)");
        goto done;
    }
    res = PyTuple_Pack(2, o_tend, o_se);
done:
    free(pos); free(prev); free(stack); free(next_waiter); free(head); free(arrived); free(resolved);
    free(row); free(nread); free(freel); free(L); free(cstack); free(start); free(T0); free(cur); free(nxt);
    free(evp_own);
    if (npb) PyBuffer_Release(&pb);
    Py_XDECREF(o_tend); Py_XDECREF(o_se);
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    for (int i = 0; i < ng; i++) PyBuffer_Release(&gb[i]);
    for (int i = 0; i < nt; i++) PyBuffer_Release(&tb[i]);
    for (int i = 0; i < ni; i++) PyBuffer_Release(&ib[i]);
    for (int i = 0; i < nm; i++) PyBuffer_Release(&mb[i]);
    for (int i = 0; i < nx; i++) PyBuffer_Release(&xb[i]);
    for (int i = 0; i < na; i++) PyBuffer_Release(&ab[i]);
    for (int i = 0; i < nv; i++) PyBuffer_Release(&vb[i]);
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

/* a by value, for groups larger than sort_vi's: runs of 32 by insertion, then merged
 * bottom-up through tmp (n entries). The order of equal values does not matter to the
 * medians (an element's "others" are the same multiset whichever of the equal values it is);
 * qsort's comparator calls cost 3x this on the 64 x 20,000 run's groups of 64. */
static void sort_vi_large(VI *a, VI *tmp, Py_ssize_t n) {
    const Py_ssize_t R = 32;
    for (Py_ssize_t lo = 0; lo < n; lo += R) sort_vi(a + lo, lo + R < n ? R : n - lo);
    VI *src = a, *dst = tmp;
    for (Py_ssize_t w = R; w < n; w *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * w) {
            Py_ssize_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            Py_ssize_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = src[j].v < src[i].v ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        VI *t = src; src = dst; dst = t;
    }
    if (src != a) memcpy(a, src, sizeof(VI) * n);
}

/* For a group's n >= 2 values sorted in a: ex[a[p].i] = max(0, a[p].v - median of the other
 * n - 1 values) and hp[a[p].i] = 1 (median_excess and median_excess_comms). */
static void median_others(const VI *a, Py_ssize_t n, double *ex, uint8_t *hp) {
    Py_ssize_t m = n - 1, half = m / 2;
    for (Py_ssize_t p = 0; p < n; p++) {
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
        VI *tmp = NULL;
        Py_ssize_t tmp_n = 0;
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
                if (c <= 48) sort_vi(a, c);
                else {
                    if (c > tmp_n) {
                        VI *t = realloc(tmp, sizeof(VI) * c);
                        if (!t) { cnt[0] = -1; break; }
                        tmp = t; tmp_n = c;
                    }
                    sort_vi_large(a, tmp, c);
                }
                median_others(a, c, ex, hp);
            }
            free(tmp);
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

/* median_excess_comms(g, sl_call, wait_ev, cm_lo, cm_hi, comm_ok, ex, hp) -> None
 * median_excess for the groups of the collectives, written into ex (float64) and hp (uint8),
 * both of len(g) and zeroed by the caller: for each communication c with comm_ok[c], its
 * members' calls (sl_call[s], s in cm_lo[c]..cm_hi[c]-1) form one group and their waits
 * (wait_ev[s] >= 0) another; NaN values take no part. The same arithmetic as median_excess,
 * but the groups are read by slot instead of gathered by a counting sort over every event:
 * a collective's members lie in 64 ranks' event ranges, read as 64 streams, where the
 * counting sort wrote each event to a different cache line (0.13 s of the 64 x 20,000 model). */
static PyObject *median_excess_comms(PyObject *self, PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    static const Py_ssize_t sizes[8] = {8, 8, 8, 8, 8, 1, 8, 1};
    static const char *names[8] = {"g", "sl_call", "wait_ev", "cm_lo", "cm_hi", "comm_ok", "ex", "hp"};
    Py_buffer b[8];
    int nb = 0;
    PyObject *res = NULL;
    VI *buf = NULL, *tmp = NULL;
    for (; nb < 8; nb++) {
        int flags = PyBUF_C_CONTIGUOUS | (nb >= 6 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o[nb], &b[nb], flags) < 0) goto done;
        if (b[nb].len % sizes[nb]) {
            PyErr_Format(PyExc_ValueError, "median_excess_comms: bad buffer size (%s)", names[nb]);
            nb++;
            goto done;
        }
    }
    const double *g = b[0].buf;
    const int64_t *sl_call = b[1].buf, *wait_ev = b[2].buf, *cm_lo = b[3].buf, *cm_hi = b[4].buf;
    const uint8_t *ok = b[5].buf;
    double *ex = b[6].buf;
    uint8_t *hp = b[7].buf;
    Py_ssize_t E = b[0].len / 8, NS = b[1].len / 8, C = b[3].len / 8;
    if (b[2].len / 8 != NS || b[4].len / 8 != C || b[5].len != C || b[6].len / 8 != E || b[7].len != E) {
        PyErr_SetString(PyExc_ValueError, "median_excess_comms: bad sizes");
        goto done;
    }
    Py_ssize_t maxn = 0;
    for (Py_ssize_t c = 0; c < C; c++) {
        if (cm_lo[c] < 0 || cm_hi[c] > NS || cm_hi[c] < cm_lo[c]) {
            PyErr_SetString(PyExc_ValueError, "median_excess_comms: slot range out of bounds");
            goto done;
        }
        if (cm_hi[c] - cm_lo[c] > maxn) maxn = cm_hi[c] - cm_lo[c];
    }
    for (Py_ssize_t j = 0; j < NS; j++)
        if (sl_call[j] >= E || wait_ev[j] >= E) {
            PyErr_SetString(PyExc_ValueError, "median_excess_comms: event out of range");
            goto done;
        }
    buf = malloc(sizeof(VI) * (maxn + 1));
    tmp = malloc(sizeof(VI) * (maxn + 1));
    if (!buf || !tmp) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < C; c++) {
        if (!ok[c]) continue;
        for (int w = 0; w < 2; w++) {
            const int64_t *ev = w ? wait_ev : sl_call;
            Py_ssize_t n = 0;
            for (int64_t j = cm_lo[c]; j < cm_hi[c]; j++) {
                int64_t e = ev[j];
                if (e < 0 || isnan(g[e])) continue;
                buf[n].v = g[e];
                buf[n].i = e;
                n++;
            }
            if (n < 2) continue;
            VI *a = buf;
            if (n <= 48) sort_vi(a, n); else sort_vi_large(a, tmp, n);
            median_others(a, n, ex, hp);
        }
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    free(buf); free(tmp);
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* ------------------------------------------------------------------ host model (model.py)
 * Linear passes of model._build, each equal to the numpy code it replaces (which stays as the
 * fallback and the reference of tests/test_rootcause_fast.py). They return None where their
 * shortcut does not hold (an order the numpy code sorts for), and the caller then runs numpy. */

static inline int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t wrap_key(int64_t r, int64_t t) { return (int64_t)(((uint64_t)r << 44) + (uint64_t)t); }

typedef struct { int64_t k; int64_t i; } KI;

static void merge_sort_ki(KI *a, KI *tmp, Py_ssize_t n) {  /* stable, by k */
    for (Py_ssize_t w = 1; w < n; w *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * w) {
            Py_ssize_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            Py_ssize_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = a[j].k < a[i].k ? a[j++] : a[i++];
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, sizeof(KI) * n);
    }
}

#define NEWBYTES(o, nbytes) do { o = PyBytes_FromStringAndSize(NULL, (nbytes)); if (!o) goto done; } while (0)

/* merge_events(rank, t_enq, t_ret, t_w, t_we, base, NUL) -> None or
 *   (ev_row, ev_is_wait, ev_start, ev_rel, ev_rank, call_ev) as bytes
 * model._build's "events": calls (t_enq..t_ret) and waits (t_w..t_we) of the rows, merged by
 * the int64 key rank << 44 | ns since base (wrapping as numpy's int64 does), a wait after every
 * call of a key <= its own, waits in stable order of their keys. None when the calls' keys are
 * not in row order (numpy sorts them then). */
static PyObject *merge_events(PyObject *self, PyObject *args) {
    PyObject *o[5];
    long long base_ll, nul_ll;
    if (!PyArg_ParseTuple(args, "OOOOOLL", &o[0], &o[1], &o[2], &o[3], &o[4], &base_ll, &nul_ll)) return NULL;
    Py_buffer b[5];
    int nb = 0;
    PyObject *res = NULL, *orow = NULL, *oisw = NULL, *ost = NULL, *orel = NULL, *ork = NULL, *ocev = NULL;
    KI *w = NULL, *tmp = NULL;
    for (; nb < 5; nb++) if (get(o[nb], &b[nb], 8, "merge_events") < 0) goto done;
    Py_ssize_t n = b[0].len / 8;
    for (int i = 1; i < 5; i++) if (b[i].len / 8 != n) { PyErr_SetString(PyExc_ValueError, "merge_events: sizes"); goto done; }
    const int64_t *rank = b[0].buf, *tq = b[1].buf, *tr = b[2].buf, *tw = b[3].buf, *twe = b[4].buf;
    const int64_t base = base_ll, NUL = nul_ll;
    Py_ssize_t nc = 0, nw = 0;
    int sorted = 1;
    int64_t lastk = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (tq[i] != NUL && tr[i] != NUL) {
            int64_t k = wrap_key(rank[i], wrap_sub(tq[i], base));
            if (nc && k < lastk) sorted = 0;
            lastk = k;
            nc++;
        }
        if (tw[i] != NUL && twe[i] != NUL) nw++;
    }
    if (!sorted) { res = Py_None; Py_INCREF(res); goto done; }
    Py_ssize_t E = nc + nw;
    /* the outputs first, the temporaries after them (freed at the heap's top, for reuse) */
    NEWBYTES(orow, E * 8); NEWBYTES(oisw, E); NEWBYTES(ost, E * 8); NEWBYTES(orel, E * 8); NEWBYTES(ork, E * 8);
    NEWBYTES(ocev, n * 8);
    w = malloc(sizeof(KI) * (nw + 1));
    if (!w) { PyErr_NoMemory(); goto done; }
    int64_t *ev_row = (int64_t *)PyBytes_AS_STRING(orow), *ev_rank = (int64_t *)PyBytes_AS_STRING(ork);
    int64_t *call_ev = (int64_t *)PyBytes_AS_STRING(ocev);
    uint8_t *isw = (uint8_t *)PyBytes_AS_STRING(oisw);
    double *st = (double *)PyBytes_AS_STRING(ost), *rl = (double *)PyBytes_AS_STRING(orel);
    int wsorted = 1;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        call_ev[i] = -1;
        if (tw[i] != NUL && twe[i] != NUL) {
            w[j].k = wrap_key(rank[i], wrap_sub(tw[i], base));
            w[j].i = i;
            if (j && w[j].k < w[j - 1].k) wsorted = 0;
            j++;
        }
    }
    if (!wsorted) {
        tmp = malloc(sizeof(KI) * (nw + 1));
        if (tmp) merge_sort_ki(w, tmp, nw);
    }
    Py_ssize_t ci = 0, wi = 0, e = 0;
    while (ci < n || wi < nw) {
        while (ci < n && !(tq[ci] != NUL && tr[ci] != NUL)) ci++;
        int take_call;
        if (ci < n && wi < nw) take_call = wrap_key(rank[ci], wrap_sub(tq[ci], base)) <= w[wi].k;
        else if (ci < n) take_call = 1;
        else if (wi < nw) take_call = 0;
        else break;
        if (take_call) {
            ev_row[e] = ci; isw[e] = 0; ev_rank[e] = rank[ci];
            st[e] = (double)wrap_sub(tq[ci], base); rl[e] = (double)wrap_sub(tr[ci], base);
            call_ev[ci] = e;
            ci++;
        } else {
            int64_t r = w[wi].i;
            ev_row[e] = r; isw[e] = 1; ev_rank[e] = rank[r];
            st[e] = (double)wrap_sub(tw[r], base); rl[e] = (double)wrap_sub(twe[r], base);
            wi++;
        }
        e++;
    }
    Py_END_ALLOW_THREADS
    if (!wsorted && !tmp) { PyErr_NoMemory(); goto done; }
    res = PyTuple_Pack(6, orow, oisw, ost, orel, ork, ocev);
done:
    free(w); free(tmp);
    Py_XDECREF(orow); Py_XDECREF(oisw); Py_XDECREF(ost); Py_XDECREF(orel); Py_XDECREF(ork); Py_XDECREF(ocev);
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* anchors(ev_row, ev_start, ev_rel, ev_first, sl_of_row, sl_leave, sl_enter, sl_comm, last_enter)
 *   -> (ev_slot, ev_anchor, ev_rho, ev_dur, ev_gap, sl_block, sl_wait) as bytes
 * model._build's "anchors" in one pass over the events and one over the slots; min, max and
 * comparisons as numpy's minimum/maximum compute them. */
static inline double np_max(double a, double b) { return (a >= b || isnan(a)) ? a : b; }
static inline double np_min(double a, double b) { return (a <= b || isnan(a)) ? a : b; }

static PyObject *anchors(PyObject *self, PyObject *args) {
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8])) return NULL;
    static const Py_ssize_t sz[9] = {8, 8, 8, 1, 8, 8, 8, 8, 8};
    Py_buffer b[9];
    int nb = 0;
    PyObject *res = NULL, *oslot = NULL, *oanc = NULL, *orho = NULL, *odur = NULL, *ogap = NULL, *oblk = NULL, *owt = NULL;
    for (; nb < 9; nb++) if (get(o[nb], &b[nb], sz[nb], "anchors") < 0) goto done;
    const int64_t *ev_row = b[0].buf, *sl_of_row = b[4].buf, *sl_comm = b[7].buf;
    const double *ev_start = b[1].buf, *ev_rel = b[2].buf, *sl_leave = b[5].buf, *sl_enter = b[6].buf, *last = b[8].buf;
    const uint8_t *first = b[3].buf;
    Py_ssize_t E = b[0].len / 8, n = b[4].len / 8, NS = b[5].len / 8, C = b[8].len / 8;
    if (b[1].len / 8 != E || b[2].len / 8 != E || b[3].len != E || b[6].len / 8 != NS || b[7].len / 8 != NS) {
        PyErr_SetString(PyExc_ValueError, "anchors: sizes");
        goto done;
    }
    NEWBYTES(oslot, E * 8); NEWBYTES(oanc, E); NEWBYTES(orho, E * 8); NEWBYTES(odur, E * 8); NEWBYTES(ogap, E * 8);
    NEWBYTES(oblk, NS * 8); NEWBYTES(owt, NS * 8);
    int64_t *ev_slot = (int64_t *)PyBytes_AS_STRING(oslot);
    uint8_t *anc = (uint8_t *)PyBytes_AS_STRING(oanc);
    double *rho = (double *)PyBytes_AS_STRING(orho), *dur = (double *)PyBytes_AS_STRING(odur);
    double *gap = (double *)PyBytes_AS_STRING(ogap), *blk = (double *)PyBytes_AS_STRING(oblk);
    double *wt = (double *)PyBytes_AS_STRING(owt);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < NS; j++) blk[j] = INFINITY;
    for (Py_ssize_t e = 0; e < E; e++) {
        int64_t r = ev_row[e];
        if (r < 0 || r >= n) { bad = 1; break; }
        int64_t s = sl_of_row[r];
        if (s >= NS) { bad = 1; break; }
        ev_slot[e] = s;
        double st = ev_start[e], rl = ev_rel[e];
        int a = 0;
        if (s >= 0) {
            double L = sl_leave[s];
            a = rl >= L;
            if (a) {
                rho[e] = rl - np_max(st, isnan(L) ? -INFINITY : L);
                blk[s] = np_min(blk[s], st);
            } else {
                rho[e] = 0.0;
            }
        } else {
            rho[e] = 0.0;
        }
        anc[e] = (uint8_t)a;
        dur[e] = rl - st;
        gap[e] = first[e] ? st : st - (e ? ev_rel[e - 1] : 0.0);
    }
    if (!bad) {
        for (Py_ssize_t j = 0; j < NS; j++) {
            if (isfinite(blk[j])) {
                int64_t c = sl_comm[j];
                if (c < 0 || c >= C) { bad = 1; break; }
                wt[j] = np_max(0.0, np_min(last[c], sl_leave[j]) - blk[j]);
            } else {
                wt[j] = 0.0;
                blk[j] = sl_enter[j];
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) { PyErr_SetString(PyExc_ValueError, "anchors: index out of range"); goto done; }
    res = PyTuple_Pack(7, oslot, oanc, orho, odur, ogap, oblk, owt);
done:
    Py_XDECREF(oslot); Py_XDECREF(oanc); Py_XDECREF(orho); Py_XDECREF(odur); Py_XDECREF(ogap); Py_XDECREF(oblk);
    Py_XDECREF(owt);
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* slot_prev(group, enter, G) -> None or sl_prev (bytes, int64)
 * Per slot with group g in 0..G-1 (-1: none), the previous slot of its group in (enter, slot)
 * order; -1 for the first. None when some group's slots are not in enter order already (numpy
 * sorts them then). */
static PyObject *slot_prev(PyObject *self, PyObject *args) {
    PyObject *og, *oe;
    Py_ssize_t G;
    if (!PyArg_ParseTuple(args, "OOn", &og, &oe, &G)) return NULL;
    Py_buffer bg, be;
    if (get(og, &bg, 8, "group") < 0) return NULL;
    if (get(oe, &be, 8, "enter") < 0) { PyBuffer_Release(&bg); return NULL; }
    PyObject *res = NULL, *out = NULL;
    int64_t *last = NULL;
    Py_ssize_t n = bg.len / 8;
    if (be.len / 8 != n || G < 0) { PyErr_SetString(PyExc_ValueError, "slot_prev: sizes"); goto done; }
    const int64_t *g = bg.buf;
    const double *en = be.buf;
    last = malloc(sizeof(int64_t) * (G + 1));
    NEWBYTES(out, n * 8);
    if (!last) { PyErr_NoMemory(); goto done; }
    int64_t *prev = (int64_t *)PyBytes_AS_STRING(out);
    int ok = 1;
    for (Py_ssize_t k = 0; k < G; k++) last[k] = -1;
    for (Py_ssize_t j = 0; j < n && ok; j++) {
        int64_t k = g[j];
        prev[j] = -1;
        if (k < 0) continue;
        if (k >= G) { ok = -1; break; }
        int64_t p = last[k];
        if (p >= 0 && !(en[j] >= en[p])) { ok = 0; break; }
        prev[j] = p;
        last[k] = j;
    }
    if (ok < 0) { PyErr_SetString(PyExc_ValueError, "slot_prev: group out of range"); goto done; }
    if (!ok) { res = Py_None; Py_INCREF(res); goto done; }
    res = out; Py_INCREF(res);
done:
    free(last);
    Py_XDECREF(out);
    PyBuffer_Release(&bg); PyBuffer_Release(&be);
    return res;
}

/* The search shared by sync_points and sync_points_ev, once the anchors are bucketed by group
 * (cnt: the G + 1 bucket offsets; pos, fl: each anchor's index into arel and its floor, by
 * bucket in anchor order): found[j], val[j] for each of the NS slots. 1 done, 0 when a bucket
 * is not in floor order (the caller answers None), -1 out of memory. */
static int sync_search(Py_ssize_t G, Py_ssize_t NS, const int64_t *cnt, const int64_t *pos,
                       const double *fl, const int64_t *sg, const double *sen,
                       const double *arel, uint8_t *found, double *val) {
    for (Py_ssize_t k = 0; k < G; k++)
        for (int64_t p = cnt[k] + 1; p < cnt[k + 1]; p++)
            if (fl[p] < fl[p - 1]) return 0;
    /* each slot's answer is searched from its group's previous answer outwards (galloping,
     * then a binary search in the bracket): a group's slots come in about time order, so a
     * search reads a few anchors next to the last one instead of ~15 cache misses */
    int64_t *hint = malloc(sizeof(int64_t) * (G + 1));
    if (!hint) return -1;
    memcpy(hint, cnt, sizeof(int64_t) * (G + 1));
    for (Py_ssize_t j = 0; j < NS; j++) {
        int64_t k = sg[j];
        double q = floor(sen[j]);
        int64_t L = cnt[k], H = cnt[k + 1], h = hint[k], lo, hi;   /* first p in [L, H) with fl[p] > q */
        if (h < H && fl[h] <= q) {
            int64_t step = 1;
            lo = h + 1;
            hi = lo;
            while (hi < H && fl[hi] <= q) { lo = hi + 1; hi += step; step *= 2; }
            if (hi > H) hi = H;
        } else {
            int64_t step = 1;
            hi = h;
            lo = h;
            while (lo > L && fl[lo - 1] > q) { hi = lo - 1; lo -= step; step *= 2; if (lo < L) lo = L; }
        }
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (fl[mid] > q) hi = mid; else lo = mid + 1;
        }
        hint[k] = lo;
        if (lo > cnt[k]) { found[j] = 1; val[j] = arel[pos[lo - 1]]; }
        else { found[j] = 0; val[j] = NAN; }
    }
    free(hint);
    return 1;
}

/* The validation, bucketing and search of sync_run, without the GIL (other threads of the
 * report run meanwhile): 1 done, 0 when sync_run answers None, -1 out of memory. */
static int sync_compute(Py_ssize_t G, Py_ssize_t n, const uint8_t *anchor, const int64_t *ag,
                        const int64_t *ev_slot, const double *arel, Py_ssize_t NS,
                        const int64_t *sg, const double *sen, uint8_t *found, double *val) {
    int64_t *cnt = NULL, *pos = NULL;
    double *fl = NULL;
    Py_ssize_t A = 0;
    const double LIM = 17592186044416.0;  /* 2^44 */
    int ok = G <= (1 << 19), r = 0;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        if (anchor && !anchor[i]) continue;
        A++;
        double f = floor(arel[i]);
        int64_t g;
        if (ag) g = ag[i];
        else {
            int64_t sl = ev_slot[i];
            if (sl < 0 || sl >= NS) { ok = 0; break; }
            g = sg[sl];
        }
        if (!(f >= 0.0 && f < LIM) || g < 0 || g >= G) ok = 0;
    }
    for (Py_ssize_t j = 0; j < NS && ok; j++) {
        double f = floor(sen[j]);
        if (!(f >= 0.0 && f < LIM) || sg[j] < 0 || sg[j] >= G) ok = 0;
    }
    if (!ok) return 0;
    cnt = calloc(G + 1, sizeof(int64_t));
    pos = malloc(sizeof(int64_t) * (A + 1));
    fl = malloc(sizeof(double) * (A + 1));
    if (!cnt || !pos || !fl) { r = -1; goto out; }
#define SYNC_GROUP(i) (ag ? ag[i] : sg[ev_slot[i]])
    for (Py_ssize_t i = 0; i < n; i++) if (!anchor || anchor[i]) cnt[SYNC_GROUP(i) + 1]++;
    for (Py_ssize_t k = 0; k < G; k++) cnt[k + 1] += cnt[k];
    {
        int64_t *at = malloc(sizeof(int64_t) * (G + 1));
        if (!at) { r = -1; goto out; }
        memcpy(at, cnt, sizeof(int64_t) * (G + 1));
        for (Py_ssize_t i = 0; i < n; i++)
            if (!anchor || anchor[i]) { int64_t p = at[SYNC_GROUP(i)]++; pos[p] = i; fl[p] = floor(arel[i]); }
        free(at);
    }
#undef SYNC_GROUP
    r = sync_search(G, NS, cnt, pos, fl, sg, sen, arel, found, val);
out:
    free(cnt); free(pos); free(fl);
    return r;
}

/* The validation, bucketing and search shared by sync_points and sync_points_ev: item i of n
 * is an anchor when `anchor` is NULL or anchor[i] != 0; its group is ag[i] (`ag` given) or
 * sg[ev_slot[i]]; its time arel[i]. Returns None (out of range, a bad slot, or a bucket out of
 * floor order), the (found, value) tuple, or NULL with an exception set. */
static PyObject *sync_run(Py_ssize_t G, Py_ssize_t n, const uint8_t *anchor, const int64_t *ag,
                          const int64_t *ev_slot, const double *arel, Py_ssize_t NS,
                          const int64_t *sg, const double *sen) {
    PyObject *res = NULL, *ofound = NULL, *oval = NULL;
    int r;
    NEWBYTES(ofound, NS); NEWBYTES(oval, NS * 8);     /* the outputs before the temporaries */
    uint8_t *found = (uint8_t *)PyBytes_AS_STRING(ofound);
    double *val = (double *)PyBytes_AS_STRING(oval);
    Py_BEGIN_ALLOW_THREADS
    r = sync_compute(G, n, anchor, ag, ev_slot, arel, NS, sg, sen, found, val);
    Py_END_ALLOW_THREADS
    if (r < 0) { PyErr_NoMemory(); goto done; }
    if (r == 0) { res = Py_None; Py_INCREF(res); goto done; }
    res = PyTuple_Pack(2, ofound, oval);
done:
    Py_XDECREF(ofound); Py_XDECREF(oval);
    return res;
}

/* sync_points(a_group, a_rel, s_group, s_enter, G) -> None or (found uint8, value float64) bytes
 * For each slot j: among the anchors of its group, the last in (floor(rel), anchor order) with
 * floor(rel) <= floor(s_enter[j]): model._build's searchsorted over the int64 keys
 * group << 44 | floor(ns), which order as (group, floor) when every floor is in [0, 2^44) and
 * every group in [0, 2^19) (else None). Anchors are bucketed by group in their order; None too
 * when a bucket is not in floor order already. */
static PyObject *sync_points(PyObject *self, PyObject *args) {
    PyObject *o[4], *res = NULL;
    Py_ssize_t G;
    if (!PyArg_ParseTuple(args, "OOOOn", &o[0], &o[1], &o[2], &o[3], &G)) return NULL;
    Py_buffer b[4];
    int nb = 0;
    for (; nb < 4; nb++) if (get(o[nb], &b[nb], 8, "sync_points") < 0) goto done;
    Py_ssize_t A = b[0].len / 8, NS = b[2].len / 8;
    if (b[1].len / 8 != A || b[3].len / 8 != NS || G < 0) { PyErr_SetString(PyExc_ValueError, "sync_points: sizes"); goto done; }
    res = sync_run(G, A, NULL, b[0].buf, NULL, b[1].buf, NS, b[2].buf, b[3].buf);
done:
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* sync_points_ev(ev_slot, ev_anchor, ev_rel, s_group, s_enter, G): sync_points(s_group[ev_slot[a]],
 * ev_rel[a], s_group, s_enter, G) for a = the anchor events (ev_anchor != 0) in event order,
 * without their gathered copies (None likewise, and where an anchor's slot is out of range). */
static PyObject *sync_points_ev(PyObject *self, PyObject *args) {
    PyObject *o[5], *res = NULL;
    Py_ssize_t G;
    if (!PyArg_ParseTuple(args, "OOOOOn", &o[0], &o[1], &o[2], &o[3], &o[4], &G)) return NULL;
    Py_buffer b[5];
    int nb = 0;
    static const Py_ssize_t isz[5] = {8, 1, 8, 8, 8};
    for (; nb < 5; nb++) if (get(o[nb], &b[nb], isz[nb], "sync_points_ev") < 0) goto done;
    Py_ssize_t E = b[0].len / 8, NS = b[3].len / 8;
    if (b[1].len != E || b[2].len / 8 != E || b[4].len / 8 != NS || G < 0) {
        PyErr_SetString(PyExc_ValueError, "sync_points_ev: sizes");
        goto done;
    }
    res = sync_run(G, E, b[1].buf, NULL, b[0].buf, b[2].buf, NS, b[3].buf, b[4].buf);
done:
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* cp_walk(ev_rank, ev_start, ev_rel, ev_anchor, ev_slot, ev_first, sl_leave, sl_dep, sl_comm,
 *         sl_call, sl_enter, sl_rank, cm_T0, cm_last, q_prev, t_begin, e0, guard)
 *   -> None or (rank, t0, t1, kind, comm, event) as bytes, in time order
 * critical_path.walk's loop (the Python there is its reference), from the end of event e0;
 * max(x, y) as Python's (y only when y > x). None when the walk would index an event < 0
 * (Python would wrap around: the caller runs the Python loop). */
static inline double py_max(double x, double y) { return y > x ? y : x; }

typedef struct { int64_t r; double t0, t1; int64_t k, c, e; } Seg;

static PyObject *cp_walk(PyObject *self, PyObject *args) {
    PyObject *o[15];
    double tb;
    long long e0_ll, guard_ll;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOdLL", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &tb, &e0_ll, &guard_ll))
        return NULL;
    static const Py_ssize_t sz[15] = {8, 8, 8, 1, 8, 1, 8, 1, 8, 8, 8, 8, 8, 8, 8};
    Py_buffer b[15];
    int nb = 0;
    PyObject *res = NULL, *out[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    Seg *seg = NULL;
    for (; nb < 15; nb++) if (get(o[nb], &b[nb], sz[nb], "cp_walk") < 0) goto done;
    const int64_t *ev_rank = b[0].buf, *ev_slot = b[4].buf, *sl_comm = b[8].buf, *sl_call = b[9].buf;
    const int64_t *sl_rank = b[11].buf, *cm_last = b[13].buf, *q_prev = b[14].buf;
    const double *ev_start = b[1].buf, *ev_rel = b[2].buf, *sl_leave = b[6].buf, *sl_enter = b[10].buf;
    const double *cm_T0 = b[12].buf;
    const uint8_t *anchor = b[3].buf, *first = b[5].buf, *sl_dep = b[7].buf;
    Py_ssize_t E = b[0].len / 8, NS = b[6].len / 8, C = b[12].len / 8;
    Py_ssize_t n = 0, cap = 1024;
    seg = malloc(sizeof(Seg) * cap);
    if (!seg) { PyErr_NoMemory(); goto done; }
    int64_t e = e0_ll, s = -1, guard = guard_ll;
    int mode = 0, fallback = 0;
#define PUSH(R, A, B, K, CC, EE) do { \
        if (n == cap) { Seg *t = realloc(seg, sizeof(Seg) * cap * 2); if (!t) { PyErr_NoMemory(); goto done; } seg = t; cap *= 2; } \
        seg[n].r = (R); seg[n].t0 = (A); seg[n].t1 = (B); seg[n].k = (K); seg[n].c = (CC); seg[n].e = (EE); n++; } while (0)
#define CHECK_E(x) do { if ((x) < 0 || (x) >= E) { fallback = 1; goto walked; } } while (0)
#define CHECK_S(x) do { if ((x) < 0 || (x) >= NS) { fallback = 1; goto walked; } } while (0)
    CHECK_E(e);
    while (guard > 0) {
        guard--;
        if (mode == 0) {
            int64_t r = ev_rank[e];
            if (anchor[e]) {
                s = ev_slot[e];
                CHECK_S(s);
                double L = sl_leave[s];
                if (L >= ev_start[e]) {
                    double a = py_max(L, tb);
                    if (ev_rel[e] > a) PUSH(r, a, ev_rel[e], 1, sl_comm[s], e);
                    if (L <= tb) break;
                    mode = 2;
                    continue;
                }
            }
            double a = py_max(ev_start[e], tb);
            if (ev_rel[e] > a) {
                int64_t sl = ev_slot[e];
                if (sl >= NS) { fallback = 1; goto walked; }
                PUSH(r, a, ev_rel[e], 1, sl >= 0 ? sl_comm[sl] : -1, e);
            }
            mode = 1;
        } else if (mode == 1) {
            int64_t r = ev_rank[e];
            if (first[e] || ev_start[e] <= tb) break;
            CHECK_E(e - 1);
            double a = py_max(ev_rel[e - 1], tb);
            if (ev_start[e] > a) PUSH(r, a, ev_start[e], 0, -1, e);
            e -= 1;
            mode = 0;
        } else {
            int64_t c = sl_comm[s];
            if (c < 0 || c >= C) { fallback = 1; goto walked; }
            int64_t r = sl_rank[s];
            double L = sl_leave[s];
            if (sl_dep[s]) {
                double T0 = cm_T0[c];
                double a = py_max(T0, tb);
                if (L > a) PUSH(r, a, L, 2, c, -1);
                if (T0 <= tb) break;
                int64_t d = cm_last[c];
                CHECK_S(d);
                if (sl_enter[d] >= T0) {
                    e = sl_call[d]; CHECK_E(e); mode = 1;
                } else {
                    int64_t bs = q_prev[c];
                    if (bs < 0) { e = sl_call[d]; CHECK_E(e); mode = 1; }
                    else { s = bs; CHECK_S(s); mode = 2; }
                }
            } else {
                double a = py_max(sl_enter[s], tb);
                if (L > a) PUSH(r, a, L, 2, c, -1);
                e = sl_call[s];
                CHECK_E(e);
                mode = 1;
            }
        }
    }
walked:
    if (fallback) { res = Py_None; Py_INCREF(res); goto done; }
    for (int i = 0; i < 6; i++) {
        out[i] = PyBytes_FromStringAndSize(NULL, n * 8);
        if (!out[i]) goto done;
    }
    {
        int64_t *orank = (int64_t *)PyBytes_AS_STRING(out[0]), *okind = (int64_t *)PyBytes_AS_STRING(out[3]);
        int64_t *ocomm = (int64_t *)PyBytes_AS_STRING(out[4]), *oev = (int64_t *)PyBytes_AS_STRING(out[5]);
        double *ot0 = (double *)PyBytes_AS_STRING(out[1]), *ot1 = (double *)PyBytes_AS_STRING(out[2]);
        for (Py_ssize_t i = 0; i < n; i++) {
            Seg *g = &seg[n - 1 - i];
            orank[i] = g->r; ot0[i] = g->t0; ot1[i] = g->t1; okind[i] = g->k; ocomm[i] = g->c; oev[i] = g->e;
        }
    }
    res = PyTuple_Pack(6, out[0], out[1], out[2], out[3], out[4], out[5]);
done:
    free(seg);
    for (int i = 0; i < 6; i++) Py_XDECREF(out[i]);
    for (int i = 0; i < nb; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* counting_argsort(keys, K) -> order (bytes, int64)
 * np.argsort(keys, kind="stable") for integer keys in [0, K), by one counting sort (numpy's
 * stable sort of int64 is a merge sort). ValueError on a key outside [0, K). */
static PyObject *counting_argsort(PyObject *self, PyObject *args) {
    PyObject *ok;
    Py_ssize_t K;
    if (!PyArg_ParseTuple(args, "On", &ok, &K)) return NULL;
    Py_buffer bk;
    if (get(ok, &bk, 8, "keys") < 0) return NULL;
    PyObject *res = NULL, *out = NULL;
    int64_t *cnt = NULL;
    Py_ssize_t n = bk.len / 8;
    const int64_t *k = bk.buf;
    if (K < 0) { PyErr_SetString(PyExc_ValueError, "counting_argsort: K < 0"); goto done; }
    NEWBYTES(out, n * 8);
    cnt = calloc(K + 1, sizeof(int64_t));
    if (!cnt) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (k[i] < 0 || k[i] >= K) { PyErr_SetString(PyExc_ValueError, "counting_argsort: key out of range"); goto done; }
        cnt[k[i] + 1]++;
    }
    for (Py_ssize_t j = 0; j < K; j++) cnt[j + 1] += cnt[j];
    int64_t *o = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) o[cnt[k[i]]++] = i;
    res = out; Py_INCREF(res);
done:
    free(cnt);
    Py_XDECREF(out);
    PyBuffer_Release(&bk);
    return res;
}

/* galloping np.searchsorted(k, x, side) from the previous answer *h (in [0, n]) outwards, which
 * it updates: gallop up or down, then a binary search in the bracket; the answer is the first
 * position p with k[p] > x (right) or k[p] >= x (left), and "before(p)" means k[p] precedes it
 * (search_along, delay analysis) */
static inline Py_ssize_t gallop_one(const int64_t *k, Py_ssize_t n, int64_t x, int right, Py_ssize_t *h) {
#define BEFORE(p) (right ? k[p] <= x : k[p] < x)
    Py_ssize_t lo, hi, c = *h;
    if (c < n && BEFORE(c)) {
        Py_ssize_t step = 1;
        lo = c + 1;
        hi = lo;
        while (hi < n && BEFORE(hi)) { lo = hi + 1; hi += step; step *= 2; }
        if (hi > n) hi = n;
    } else {
        Py_ssize_t step = 1;
        hi = c;
        lo = c;
        while (lo > 0 && !BEFORE(lo - 1)) { hi = lo - 1; lo -= step; step *= 2; if (lo < 0) lo = 0; }
    }
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (BEFORE(mid)) lo = mid + 1; else hi = mid;
    }
#undef BEFORE
    *h = lo;
    return lo;
}

/* gallop_one for the queries q[o[i]], i in order o, each from the previous one's answer */
static void gallop(const int64_t *k, Py_ssize_t n, const int64_t *q, const int64_t *o, Py_ssize_t m, int right,
                   int64_t *r) {
    Py_ssize_t h = 0;
    for (Py_ssize_t i = 0; i < m; i++) r[o[i]] = gallop_one(k, n, q[o[i]], right, &h);
}

/* search_along(keys, q, order, right) -> positions (bytes, int64), or None
 * np.searchsorted(keys, q, "right" if right else "left") for sorted int64 keys, the queries
 * taken in `order` (a permutation of 0..len(q)-1) and each searched from the previous one's
 * answer outwards (galloping, then a binary search in the bracket): when `order` leaves the
 * queries nearly sorted, each reads a few keys next to the last, instead of the ~20 cache
 * misses of a search from scratch (delay.py: 1.28M slots' interval ends among the slots' and
 * the events' keys). The answer is the same for any order. None when the keys are not sorted
 * (numpy's answer then depends on its search path) or `order` is no permutation. */
static PyObject *search_along(PyObject *self, PyObject *args) {
    PyObject *okeys, *oq, *oo;
    int right;
    if (!PyArg_ParseTuple(args, "OOOp", &okeys, &oq, &oo, &right)) return NULL;
    Py_buffer bk, bq, bo;
    if (get(okeys, &bk, 8, "keys") < 0) return NULL;
    if (get(oq, &bq, 8, "q") < 0) { PyBuffer_Release(&bk); return NULL; }
    if (get(oo, &bo, 8, "order") < 0) { PyBuffer_Release(&bk); PyBuffer_Release(&bq); return NULL; }
    PyObject *res = NULL, *out = NULL;
    uint8_t *seen = NULL;
    const int64_t *k = bk.buf, *q = bq.buf, *o = bo.buf;
    Py_ssize_t n = bk.len / 8, m = bq.len / 8;
    int ok = 1;
    if (bo.len / 8 != m) { PyErr_SetString(PyExc_ValueError, "search_along: bad sizes"); goto done; }
    for (Py_ssize_t i = 1; i < n && ok; i++) ok = k[i - 1] <= k[i];
    seen = calloc(m + 1, 1);
    if (!seen) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < m && ok; i++) {
        int64_t j = o[i];
        ok = j >= 0 && j < m && !seen[j];
        if (ok) seen[j] = 1;
    }
    if (!ok) { res = Py_None; Py_INCREF(res); goto done; }
    NEWBYTES(out, m * 8);
    int64_t *r = (int64_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    gallop(k, n, q, o, m, right, r);
    Py_END_ALLOW_THREADS
    res = out; Py_INCREF(res);
done:
    free(seen);
    Py_XDECREF(out);
    PyBuffer_Release(&bk); PyBuffer_Release(&bq); PyBuffer_Release(&bo);
    return res;
}

/* ------------------------------------------------------------------ delay analysis (delay.py)
 * The synchronisation intervals' sums of delay.attribute and its location of the costs on the
 * delayer's events, each one pass over arrays the caller allocates, equal value by value to the
 * numpy code they replace (delay._intervals_numpy and delay._locate_numpy, the references of
 * tests/test_rootcause_fast.py). Sums are taken in the order numpy takes them (cumsum and
 * np.add.at are sequential). */

static int getbufs(PyObject *args, const char *fname, int n, Py_buffer *b, const Py_ssize_t *isz,
                   const char *wr, const char **names) {
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != n) {
        PyErr_Format(PyExc_TypeError, "%s: %d arguments", fname, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int flags = PyBUF_C_CONTIGUOUS | (wr[i] == 'w' ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, i), &b[i], flags) < 0) {
            for (int j = 0; j < i; j++) PyBuffer_Release(&b[j]);
            return -1;
        }
        if (b[i].len % isz[i]) {
            PyErr_Format(PyExc_ValueError, "%s: bad buffer size (%s)", fname, names[i]);
            for (int j = 0; j <= i; j++) PyBuffer_Release(&b[j]);
            return -1;
        }
    }
    return 0;
}


/* floor(x) as int64 for a finite x within int64's range (numpy's astype); 0 and *bad = 1 else */
static inline int64_t floor_i64(double x, int *bad) {
    double f = floor(x);
    if (!(f >= -9.2e18 && f <= 9.2e18)) { *bad = 1; return 0; }
    return (int64_t)f;
}

/* delay_intervals(so, keys, sl_rank, sl_sync, sl_enter, omega, ev_rank, ev_start, ev_first, ev_gap,
 *                 d_slot, waiting, lo, hi, s_lo, s_hi, W, comp, f, gpos, cg) -> bool
 * delay._intervals_numpy into the last nine arrays (int64 lo, hi, s_lo, s_hi and float64 W, comp,
 * f of the slots; gpos of the events, cg of E + 1). False (nothing meaningful written) where
 * its shortcut does not hold: a time that is not finite, or event keys out of order. */
static PyObject *delay_intervals(PyObject *self, PyObject *args) {
    enum { N = 21 };
    static const Py_ssize_t isz[N] = {8, 8, 8, 8, 8, 8, 8, 8, 1, 8, 8, 1, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    static const char wr[N + 1] = "rrrrrrrrrrrrwwwwwwwww";
    static const char *names[N] = {"so", "keys", "sl_rank", "sl_sync", "sl_enter", "omega", "ev_rank", "ev_start",
                                   "ev_first", "ev_gap", "d_slot", "waiting", "lo", "hi", "s_lo", "s_hi", "W",
                                   "comp", "f", "gpos", "cg"};
    Py_buffer b[N];
    if (getbufs(args, "delay_intervals", N, b, isz, wr, names) < 0) return NULL;
    PyObject *res = NULL;
    int64_t *qs = NULL, *qe = NULL, *ek = NULL;
    double *cum = NULL;
    const int64_t *so = b[0].buf, *keys = b[1].buf, *sl_rank = b[2].buf, *ev_rank = b[6].buf, *d = b[10].buf;
    const double *sync = b[3].buf, *enter = b[4].buf, *omega = b[5].buf, *ev_start = b[7].buf, *gap = b[9].buf;
    const uint8_t *first = b[8].buf, *waiting = b[11].buf;
    int64_t *lo = b[12].buf, *hi = b[13].buf, *s_lo = b[14].buf, *s_hi = b[15].buf;
    double *W = b[16].buf, *comp = b[17].buf, *f = b[18].buf, *gpos = b[19].buf, *cg = b[20].buf;
    Py_ssize_t NS = b[0].len / 8, E = b[6].len / 8;
    int sizes_ok = b[1].len / 8 == NS && b[2].len / 8 == NS && b[3].len / 8 == NS && b[4].len / 8 == NS
                   && b[5].len / 8 == NS && b[7].len / 8 == E && b[8].len == E && b[9].len / 8 == E
                   && b[10].len / 8 == NS && b[11].len == NS;
    for (int i = 12; i < 19; i++) sizes_ok = sizes_ok && b[i].len / 8 == NS;
    sizes_ok = sizes_ok && b[19].len / 8 == E && b[20].len / 8 == E + 1;
    if (!sizes_ok) { PyErr_SetString(PyExc_ValueError, "delay_intervals: bad sizes"); goto done; }
    for (Py_ssize_t j = 0; j < NS; j++)
        if (so[j] < 0 || so[j] >= NS || d[j] < 0 || d[j] >= NS) {
            PyErr_SetString(PyExc_ValueError, "delay_intervals: index out of range");
            goto done;
        }
    qs = malloc(sizeof(int64_t) * (NS + 1));
    qe = malloc(sizeof(int64_t) * (NS + 1));
    ek = malloc(sizeof(int64_t) * (E + 1));
    cum = malloc(sizeof(double) * (NS + 1));
    if (!qs || !qe || !ek || !cum) { PyErr_NoMemory(); goto done; }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < NS && !bad; j++) {
        qs[j] = wrap_key(sl_rank[j], floor_i64(sync[j], &bad));
        qe[j] = wrap_key(sl_rank[j], floor_i64(enter[j], &bad));
    }
    for (Py_ssize_t e = 0; e < E && !bad; e++) {
        ek[e] = wrap_key(ev_rank[e], floor_i64(ev_start[e], &bad));
        if (e && ek[e] < ek[e - 1]) bad = 1;
    }
    for (Py_ssize_t i = 1; i < NS && !bad; i++)
        if (keys[i] < keys[i - 1]) bad = 1;
    if (!bad) {
        cum[0] = 0.0;
        for (Py_ssize_t i = 0; i < NS; i++) cum[i + 1] = cum[i] + omega[so[i]];
        cg[0] = 0.0;
        for (Py_ssize_t e = 0; e < E; e++) {
            double g = gap[e];
            gpos[e] = first[e] ? 0.0 : np_max(g, 0.0);
            cg[e + 1] = cg[e] + gpos[e];
        }
        /* the four searches of gallop (lo, hi among the slots' keys; s_lo, s_hi among the
         * events'), each from its own previous answer, in one pass over the slots in `so`
         * order: each slot's two queries read once, and W and comp from the running sums at
         * the answers (near the previous ones) rather than in slot order (random reads) */
        Py_ssize_t h1 = 0, h2 = 0, h3 = 0, h4 = 0;
        for (Py_ssize_t i = 0; i < NS; i++) {
            if (i + 16 < NS) {   /* (the slots come in `so` order: their reads and writes fetched ahead) */
                int64_t jn = so[i + 16];
                PREFETCH(qs + jn, 0);
                PREFETCH(qe + jn, 0);
                PREFETCH(lo + jn, 1);
                PREFETCH(hi + jn, 1);
                PREFETCH(s_lo + jn, 1);
                PREFETCH(s_hi + jn, 1);
                PREFETCH(W + jn, 1);
                PREFETCH(comp + jn, 1);
            }
            int64_t j = so[i], xs = qs[j], xe = qe[j];
            Py_ssize_t a = gallop_one(keys, NS, xs, 0, &h1), bq = gallop_one(keys, NS, xe, 0, &h2);
            Py_ssize_t c = gallop_one(ek, E, xs, 1, &h3), dq = gallop_one(ek, E, xe, 1, &h4);
            lo[j] = a; hi[j] = bq; s_lo[j] = c; s_hi[j] = dq;
            W[j] = cum[bq] - cum[a];
            comp[j] = cg[dq] - cg[c];
        }
        for (Py_ssize_t j = 0; j < NS; j++) {
            int64_t k = d[j];
            double ec = np_max(0.0, comp[k] - comp[j]), ew = np_max(0.0, W[k] - W[j]);
            double tot = ec + ew;
            double fj = tot > 0 ? ec / tot : 1.0;
            f[j] = waiting[j] ? fj : 1.0;
        }
    }
    Py_END_ALLOW_THREADS
    res = bad ? Py_False : Py_True;
    Py_INCREF(res);
done:
    free(qs); free(qe); free(ek); free(cum);
    for (int i = 0; i < N; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* delay_locate(ws, d_slot, s_lo, s_hi, direct, prop, x, gpos, cg, sl_call, ev_d, ev_p) -> None
 * delay._locate_numpy: the delay costs of the waiting slots ws (int64, increasing) spread over
 * the delayer's events in (s_lo, s_hi] of its interval, by their excess x where the interval
 * has excess, else by their gaps gpos, else onto the slot's call; added into ev_d and ev_p
 * (float64, E, zeroed by the caller). */
static PyObject *delay_locate(PyObject *self, PyObject *args) {
    enum { N = 12 };
    static const Py_ssize_t isz[N] = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    static const char wr[N + 1] = "rrrrrrrrrrww";
    static const char *names[N] = {"ws", "d_slot", "s_lo", "s_hi", "direct", "prop", "x", "gpos", "cg", "sl_call",
                                   "ev_d", "ev_p"};
    Py_buffer b[N];
    if (getbufs(args, "delay_locate", N, b, isz, wr, names) < 0) return NULL;
    PyObject *res = NULL;
    double *cx = NULL, *sx = NULL, *sg = NULL, *diff = NULL;
    uint8_t *use = NULL;
    const int64_t *ws = b[0].buf, *d = b[1].buf, *s_lo = b[2].buf, *s_hi = b[3].buf, *sl_call = b[9].buf;
    const double *direct = b[4].buf, *prop = b[5].buf, *x = b[6].buf, *gpos = b[7].buf, *cg = b[8].buf;
    double *ev_d = b[10].buf, *ev_p = b[11].buf;
    Py_ssize_t K = b[0].len / 8, NS = b[1].len / 8, E = b[6].len / 8;
    if (b[2].len / 8 != NS || b[3].len / 8 != NS || b[4].len / 8 != NS || b[5].len / 8 != NS || b[7].len / 8 != E
        || b[8].len / 8 != E + 1 || b[9].len / 8 != NS || b[10].len / 8 != E || b[11].len / 8 != E) {
        PyErr_SetString(PyExc_ValueError, "delay_locate: bad sizes");
        goto done;
    }
    for (Py_ssize_t i = 0; i < K; i++) {
        int64_t w = ws[i];
        if (w < 0 || w >= NS || d[w] < 0 || d[w] >= NS) { PyErr_SetString(PyExc_ValueError, "delay_locate: index out of range"); goto done; }
        int64_t k = d[w];
        if (s_lo[k] < 0 || s_lo[k] > E || s_hi[k] < 0 || s_hi[k] > E || sl_call[k] < -E || sl_call[k] >= E) {
            PyErr_SetString(PyExc_ValueError, "delay_locate: event out of range");
            goto done;
        }
    }
    cx = malloc(sizeof(double) * (E + 1));
    diff = malloc(sizeof(double) * (E + 1));
    sx = malloc(sizeof(double) * (K + 1));
    sg = malloc(sizeof(double) * (K + 1));
    use = malloc(K + 1);
    if (!cx || !diff || !sx || !sg || !use) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    cx[0] = 0.0;
    for (Py_ssize_t e = 0; e < E; e++) cx[e + 1] = cx[e] + x[e];
    int any[3] = {0, 0, 0};
    for (Py_ssize_t i = 0; i < K; i++) {
        int64_t k = d[ws[i]];
        sx[i] = cx[s_hi[k]] - cx[s_lo[k]];
        sg[i] = cg[s_hi[k]] - cg[s_lo[k]];
        use[i] = sx[i] > 0 ? 0 : (sg[i] > 0 ? 1 : 2);
        any[use[i]] = 1;
    }
    for (int pass = 0; pass < 2; pass++) {
        const double *amt = pass ? prop : direct;
        double *acc = pass ? ev_p : ev_d;
        for (int u = 0; u < 2; u++) {
            if (!any[u]) continue;
            const double *cw = u ? sg : sx, *wts = u ? gpos : x;
            memset(diff, 0, sizeof(double) * (E + 1));
            for (Py_ssize_t i = 0; i < K; i++)
                if (use[i] == u) diff[s_lo[d[ws[i]]]] += amt[ws[i]] / cw[i];
            for (Py_ssize_t i = 0; i < K; i++)
                if (use[i] == u) diff[s_hi[d[ws[i]]]] += -(amt[ws[i]] / cw[i]);
            double run = 0.0;
            for (Py_ssize_t e = 0; e < E; e++) {
                run += diff[e];
                double t = wts[e] * run;
                acc[e] += t;
            }
        }
        if (any[2])
            for (Py_ssize_t i = 0; i < K; i++)
                if (use[i] == 2) {
                    int64_t c = sl_call[d[ws[i]]];
                    acc[c < 0 ? c + E : c] += amt[ws[i]];
                }
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    free(cx); free(diff); free(sx); free(sg); free(use);
    for (int i = 0; i < N; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* ------------------------------------------------------------------ string codes (model.py)
 * str_codes(chunks, starts, rows) -> (codes, values)
 * Arrow's dictionary_encode of a string column (int32 offsets), as model._dict_values and
 * _Rows.codes_at use it: equal strings, equal codes, numbered in order of first appearance;
 * null -> -1; `values` the strings in code order. `chunks`: a list of (offsets buffer, data
 * buffer, validity buffer or None, offset, length) per chunk; `starts` (int64): the first row
 * of each chunk and the total; `rows` (int64, row positions in the column) or None for every
 * row in order. Without pyarrow.compute (its import) and the copy of combine_chunks. */
typedef struct { const int32_t *off; const char *data; const uint8_t *valid; int64_t offset, length; Py_ssize_t dlen, olen; } SChunk;

static inline uint64_t str_hash(const char *p, int32_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int32_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ULL; }
    return h ^ (uint64_t)n;
}

static PyObject *str_codes(PyObject *self, PyObject *args) {
    PyObject *ochunks, *ostarts, *orows;
    if (!PyArg_ParseTuple(args, "OOO", &ochunks, &ostarts, &orows)) return NULL;
    if (!PyList_Check(ochunks)) { PyErr_SetString(PyExc_TypeError, "str_codes: chunks must be a list"); return NULL; }
    Py_ssize_t K = PyList_GET_SIZE(ochunks);
    Py_buffer bs, br, *bufs = NULL;
    int have_rows = orows != Py_None, nbufs = 0;
    PyObject *res = NULL, *ocodes = NULL, *values = NULL;
    SChunk *ch = NULL;
    int64_t *slot_code = NULL, *first_row = NULL;   /* hash table: code per slot; each code's first (chunk, row) */
    int32_t *first_len = NULL;
    const char **first_ptr = NULL;
    if (get(ostarts, &bs, 8, "starts") < 0) return NULL;
    if (have_rows && get(orows, &br, 8, "rows") < 0) { PyBuffer_Release(&bs); return NULL; }
    const int64_t *starts = bs.buf;
    if (bs.len / 8 != K + 1) { PyErr_SetString(PyExc_ValueError, "str_codes: starts must have len(chunks) + 1 entries"); goto done; }
    ch = calloc(K + 1, sizeof(SChunk));
    bufs = calloc(3 * K + 1, sizeof(Py_buffer));
    if (!ch || !bufs) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t c = 0; c < K; c++) {
        PyObject *t = PyList_GET_ITEM(ochunks, c);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) { PyErr_SetString(PyExc_ValueError, "str_codes: bad chunk"); goto done; }
        ch[c].offset = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
        ch[c].length = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
        if (PyErr_Occurred()) goto done;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 0), &bufs[nbufs], PyBUF_SIMPLE) < 0) goto done;
        ch[c].off = bufs[nbufs].buf; ch[c].olen = bufs[nbufs].len / 4; nbufs++;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 1), &bufs[nbufs], PyBUF_SIMPLE) < 0) goto done;
        ch[c].data = bufs[nbufs].buf; ch[c].dlen = bufs[nbufs].len; nbufs++;
        PyObject *v = PyTuple_GET_ITEM(t, 2);
        if (v != Py_None) {
            if (PyObject_GetBuffer(v, &bufs[nbufs], PyBUF_SIMPLE) < 0) goto done;
            ch[c].valid = bufs[nbufs].buf;
            if (bufs[nbufs].len * 8 < ch[c].offset + ch[c].length) { nbufs++; PyErr_SetString(PyExc_ValueError, "str_codes: short validity"); goto done; }
            nbufs++;
        }
        if (ch[c].offset < 0 || ch[c].length < 0 || ch[c].offset + ch[c].length + 1 > ch[c].olen
            || starts[c + 1] - starts[c] != ch[c].length) {
            PyErr_SetString(PyExc_ValueError, "str_codes: bad chunk bounds");
            goto done;
        }
        for (int64_t i = ch[c].offset; i <= ch[c].offset + ch[c].length; i++)
            if (ch[c].off[i] < 0 || ch[c].off[i] > ch[c].dlen || (i > ch[c].offset && ch[c].off[i] < ch[c].off[i - 1])) {
                PyErr_SetString(PyExc_ValueError, "str_codes: bad offsets");
                goto done;
            }
    }
    Py_ssize_t n = have_rows ? br.len / 8 : starts[K];
    const int64_t *rows = have_rows ? br.buf : NULL;
    if (have_rows)
        for (Py_ssize_t i = 0; i < n; i++)
            if (rows[i] < 0 || rows[i] >= starts[K]) { PyErr_SetString(PyExc_ValueError, "str_codes: row out of range"); goto done; }
    ocodes = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!ocodes) goto done;
    int64_t *codes = (int64_t *)PyBytes_AS_STRING(ocodes);
    Py_ssize_t cap = 64, ncodes = 0;
    slot_code = malloc(sizeof(int64_t) * cap);
    Py_ssize_t fcap = 32;
    first_ptr = malloc(sizeof(char *) * fcap);
    first_len = malloc(sizeof(int32_t) * fcap);
    if (!slot_code || !first_ptr || !first_len) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < cap; i++) slot_code[i] = -1;
    int oom = 0;
    Py_ssize_t c = 0;
    for (Py_ssize_t i = 0; i < n && !oom; i++) {
        int64_t row = have_rows ? rows[i] : i;
        if (!(row >= starts[c] && row < starts[c + 1])) {
            if (have_rows) {   /* the chunk holding row: binary search */
                Py_ssize_t lo = 0, hi = K - 1;
                while (lo < hi) { Py_ssize_t mid = (lo + hi + 1) / 2; if (starts[mid] <= row) lo = mid; else hi = mid - 1; }
                c = lo;
                while (c < K - 1 && starts[c + 1] <= row) c++;   /* (empty chunks) */
            } else {
                while (c < K && row >= starts[c + 1]) c++;
            }
        }
        const SChunk *k = &ch[c];
        int64_t j = k->offset + (row - starts[c]);
        if (k->valid && !((k->valid[j >> 3] >> (j & 7)) & 1)) { codes[i] = -1; continue; }
        const char *p = k->data + k->off[j];
        int32_t len = k->off[j + 1] - k->off[j];
        uint64_t h = str_hash(p, len);
        Py_ssize_t at = (Py_ssize_t)(h & (uint64_t)(cap - 1));
        for (;;) {
            int64_t code = slot_code[at];
            if (code < 0) {
                if (ncodes == fcap) {
                    fcap *= 2;
                    const char **np_ = realloc(first_ptr, sizeof(char *) * fcap);
                    if (!np_) { oom = 1; break; }
                    first_ptr = np_;
                    int32_t *nl = realloc(first_len, sizeof(int32_t) * fcap);
                    if (!nl) { oom = 1; break; }
                    first_len = nl;
                }
                first_ptr[ncodes] = p; first_len[ncodes] = len;
                slot_code[at] = ncodes;
                codes[i] = ncodes++;
                if (2 * ncodes > cap) {   /* grow and rehash */
                    Py_ssize_t ncap = cap * 4;
                    int64_t *ns = malloc(sizeof(int64_t) * ncap);
                    if (!ns) { oom = 1; break; }
                    for (Py_ssize_t q = 0; q < ncap; q++) ns[q] = -1;
                    for (Py_ssize_t q = 0; q < ncodes; q++) {
                        Py_ssize_t a = (Py_ssize_t)(str_hash(first_ptr[q], first_len[q]) & (uint64_t)(ncap - 1));
                        while (ns[a] >= 0) a = (a + 1) & (ncap - 1);
                        ns[a] = q;
                    }
                    free(slot_code); slot_code = ns; cap = ncap;
                }
                break;
            }
            if (first_len[code] == len && memcmp(first_ptr[code], p, len) == 0) { codes[i] = code; break; }
            at = (at + 1) & (cap - 1);
        }
    }
    if (oom) { PyErr_NoMemory(); goto done; }
    values = PyList_New(ncodes);
    if (!values) goto done;
    for (Py_ssize_t q = 0; q < ncodes; q++) {
        PyObject *u = PyUnicode_DecodeUTF8(first_ptr[q], first_len[q], "strict");
        if (!u) goto done;
        PyList_SET_ITEM(values, q, u);
    }
    res = PyTuple_Pack(2, ocodes, values);
done:
    Py_XDECREF(ocodes); Py_XDECREF(values);
    free(slot_code); free(first_ptr); free(first_len); free(first_row); free(ch);
    for (int i = 0; i < nbufs; i++) PyBuffer_Release(&bufs[i]);
    free(bufs);
    PyBuffer_Release(&bs);
    if (have_rows) PyBuffer_Release(&br);
    return res;
}

static PyMethodDef methods[] = {
    {"counting_argsort", counting_argsort, METH_VARARGS, "Stable argsort of small integer keys (model.py)."},
    {"delay_intervals", delay_intervals, METH_VARARGS, "Synchronisation intervals' sums of delay analysis (delay.py)."},
    {"delay_locate", delay_locate, METH_VARARGS, "Delay costs located on the delayer's events (delay.py)."},
    {"str_codes", str_codes, METH_VARARGS, "Dictionary codes of a string column (model.py)."},
    {"search_along", search_along, METH_VARARGS, "np.searchsorted along an order of the queries (delay.py)."},
    {"cp_walk", cp_walk, METH_VARARGS, "The critical path's backward walk (critical_path.py)."},
    {"merge_events", merge_events, METH_VARARGS, "Host events of the rows in order (model.py)."},
    {"anchors", anchors, METH_VARARGS, "Anchors, residuals, gaps and wait states (model.py)."},
    {"slot_prev", slot_prev, METH_VARARGS, "Previous slot of the same group (model.py)."},
    {"sync_points", sync_points, METH_VARARGS, "Synchronisation points of slots (model.py)."},
    {"sync_points_ev", sync_points_ev, METH_VARARGS, "sync_points of the anchor events, read in place"},
    {"median_excess_comms", median_excess_comms, METH_VARARGS, "median_excess for the collectives' groups, by slot (model.py)."},
    {"median_excess", median_excess, METH_VARARGS, "Excess over the median of the others in a group (model.py)."},
    {"replay", replay, METH_VARARGS, "Replay the host model (see commtrace/analysis/replay.py)."},
    {"replay_many", replay_many, METH_VARARGS, "Replay several scenarios in one pass (see replay.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replay", NULL, -1, methods};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
