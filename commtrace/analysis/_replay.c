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

static PyMethodDef methods[] = {
    {"replay", replay, METH_VARARGS, "Replay the host model (see commtrace/analysis/replay.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replay", NULL, -1, methods};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
