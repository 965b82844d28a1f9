/* The device timer of commtrace/capture/device.py (EventTimer) in C, for CUDA.
 *
 * Why: on the GPU check's H200 (docs/gpu-validation.md, runs 4 and 5) the Python EventTimer
 * added 28-30 us of host time per blocking op with its polling thread running (A4), where the
 * bound is 10: 13 us in on_issue + on_return (Python frames, torch.cuda.Event's bindings) and
 * the rest the writer's poll, whose Python work per op holds the GIL the training thread needs
 * when its collective returns. Here every per-op step is a C call, events are raw CUDA driver
 * handles (cuEventRecord on the stream torch reports as current), and poll() queries events
 * with the GIL released.
 *
 * The logic is EventTimer's, line for line (same pool order, same calibration choice, same
 * rounding): tests/test_device_ctimer.py runs every test of the fake layer
 * (tests/test_device_fake.py) against this type too. Two backends:
 *   - CUDA: function pointers of the CUDA driver API (libcuda), resolved by device.py through
 *     ctypes and handed over as integers; the current stream through torch's
 *     torch._C._cuda_getDevice() / _cuda_getCurrentRawStream(device).
 *   - Python: a backend object whose methods take and return integer handles
 *     (device._HandleBackend over the fake layer): for the CPU tests.
 * Never raises into the caller: errors are counted (`errors`), the first one reported through
 * `fail_cb(where, message)`, and the op is left untimed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>

#define MAXDEV 64
#define CALIBRATION_MARGIN_NS 1000000LL
#define CALIBRATION_TRIES 3
#define CALIBRATION_MAX_WAIT_NS 2000000LL
#define CUDA_ERROR_NOT_READY 600

typedef uintptr_t H;   /* an event or stream handle; event 0 = none */

/* CUDA driver API (cuda.h), declared here: the module builds without the CUDA toolkit */
typedef int (*f_eventCreate)(H *ev, unsigned flags);
typedef int (*f_eventRecord)(H ev, H stream);
typedef int (*f_eventQuery)(H ev);
typedef int (*f_eventElapsed)(float *ms, H a, H b);
typedef int (*f_streamIsCapturing)(H stream, int *status);
typedef int (*f_ctxGetCurrent)(void **ctx);
typedef int (*f_ctxSetCurrent)(void *ctx);
typedef int (*f_streamCreate)(H *stream, unsigned flags);

typedef struct {
    H *v;
    Py_ssize_t n, cap;
} Pool;

typedef struct {
    long long index;
    int device;
    H event;
    long long host_ns;
    long long bracket_ns;
} Calib;

struct Timer;

typedef struct Tok {
    PyObject_HEAD
    struct Tok *prev, *next;     /* the timer's tokens in issue order (linked: in _tokens) */
    struct Timer *timer;         /* borrowed; set while linked */
    long long op_id;
    int device;
    H stream;
    H start, end, wait_begin, done;
    int blocking;                /* -1 unknown (None), 0, 1 */
    int returned;
    long long calib;             /* calibration index at issue, 0 = none */
    long long issued_ns;
    int end_same;
    int linked;
    /* poll scratch */
    int ready;
    long long r_t0, r_t1, r_sw;
    int r_has_t1, r_has_sw;
} Tok;

typedef struct Timer {
    PyObject_HEAD
    PyObject *dict;
    int fake;                    /* Python backend (tests) */
    PyObject *backend;           /* the Python backend, or None */
    PyObject *get_device;        /* torch._C._cuda_getDevice */
    PyObject *raw_stream;        /* torch._C._cuda_getCurrentRawStream */
    PyObject *clock;             /* host clock (ns) callable, or None: CLOCK_REALTIME */
    PyObject *fail_cb;           /* fail_cb(where, message): the first error */
    pthread_mutex_t mu;
    long long calibration_interval_ns, max_pending, unwaited_timeout_ns, done_grace_ns;
    long long graph_captured_ops, events_created, dropped, errors, calib_seq,
        calibration_failures;
    int logged;
    int primed_events;           /* events made at a device's first op (CUDA) */
    const char *err_what;        /* a CUDA error met there, set as a Python error after */
    int err_rc;
    Tok *head, *tail;
    long long ntok;
    Pool pools[MAXDEV];
    Calib *cals;                 /* live calibrations, by index ascending */
    Py_ssize_t ncal, capcal;
    long long latest[MAXDEV];    /* index of the device's latest calibration, 0 none */
    long long tried[MAXDEV];
    int has_tried[MAXDEV];
    H cal_stream[MAXDEV];
    int has_cal_stream[MAXDEV];
    void *ctx[MAXDEV];
    f_eventCreate c_eventCreate;
    f_eventRecord c_eventRecord;
    f_eventQuery c_eventQuery;
    f_eventElapsed c_eventElapsed;
    f_streamIsCapturing c_streamIsCapturing;
    f_ctxGetCurrent c_ctxGetCurrent;   /* (runtime: cudaGetDevice, through ctx_get) */
    f_ctxSetCurrent c_ctxSetCurrent;   /* (runtime: cudaSetDevice, through ctx_set) */
    int rt;                      /* the functions are the CUDA runtime's (api="runtime") */
    f_streamCreate c_streamCreate;
} Timer;

static PyTypeObject TimerType, TokType;

#define LOCK(t) pthread_mutex_lock(&(t)->mu)
#define UNLOCK(t) pthread_mutex_unlock(&(t)->mu)

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* -- errors --------------------------------------------------------------------------------- */

/* Count an error; report the first through fail_cb. Holds the GIL; clears any Python error. */
static void t_fail(Timer *t, const char *where, const char *msg) {
    t->errors++;
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    PyErr_Fetch(&et, &ev, &tb);
    if (!t->logged) {
        t->logged = 1;
        PyObject *m = NULL;
        if (msg != NULL)
            m = PyUnicode_FromString(msg);
        else if (ev != NULL)
            m = PyObject_Repr(ev);
        else if (et != NULL)
            m = PyObject_Repr(et);
        if (m == NULL) {
            PyErr_Clear();
            m = PyUnicode_FromString("error");
        }
        if (m != NULL && t->fail_cb != NULL && t->fail_cb != Py_None) {
            PyObject *r = PyObject_CallFunction(t->fail_cb, "sO", where, m);
            Py_XDECREF(r);
        }
        Py_XDECREF(m);
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
}

/* This thread is in poll's query loop, the GIL released: no Python API (per thread: the
 * training thread may meet an error meanwhile, with the GIL) */
static _Thread_local int tl_nogil;

/* A CUDA driver error: a Python error now, or (the GIL released) kept for later */
static void cuda_err(Timer *t, const char *what, int rc) {
    if (tl_nogil) {
        if (t->err_what == NULL) {
            t->err_what = what;
            t->err_rc = rc;
        }
        return;
    }
    PyErr_Format(PyExc_RuntimeError, "%s failed: CUDA error %d", what, rc);
}

/* The current context (driver), or the current device + 1 as a pointer (runtime: the device is
 * what a thread has current there) */
typedef int (*f_getDevice)(int *device);
typedef int (*f_setDevice)(int device);

static int ctx_get(Timer *t, void **ctx) {
    if (!t->rt)
        return t->c_ctxGetCurrent(ctx);
    int d = -1;
    int rc = ((f_getDevice)(void *)t->c_ctxGetCurrent)(&d);
    *ctx = rc == 0 && d >= 0 ? (void *)(intptr_t)(d + 1) : NULL;
    return rc;
}

static int ctx_set(Timer *t, void *ctx) {
    if (!t->rt)
        return t->c_ctxSetCurrent(ctx);
    return ((f_setDevice)(void *)t->c_ctxSetCurrent)((int)((intptr_t)ctx - 1));
}

/* -- the backend ---------------------------------------------------------------------------- */
/* Each returns 0 on success, -1 on error (a Python error may be set; callers clear it). The
 * Python backend's calls need the GIL: in fake mode the GIL is never released. */

static int pyret_handle(PyObject *r, H *out) {
    if (r == NULL)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLongMask(r);
    Py_DECREF(r);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (H)v;
    return 0;
}

/* A Python call's result as a long / a truth value / a double (the reference taken; -1 on
 * error, a Python error set) */
static int ret_long(PyObject *r, long *out) {
    if (r == NULL)
        return -1;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int ret_truth(PyObject *r) {
    if (r == NULL)
        return -1;
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

static int ret_double(PyObject *r, double *out) {
    if (r == NULL)
        return -1;
    double v = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int b_current_stream(Timer *t, H *stream, int *device) {
    if (t->fake) {
        H s;
        if (pyret_handle(PyObject_CallMethod(t->backend, "current_stream", NULL), &s) < 0)
            return -1;
        long dv;
        if (ret_long(PyObject_CallMethod(t->backend, "stream_device", "K",
                                         (unsigned long long)s), &dv) < 0)
            return -1;
        *stream = s;
        *device = (int)dv;
        return 0;
    }
    PyObject *d = PyObject_CallNoArgs(t->get_device);
    long dv = d != NULL ? PyLong_AsLong(d) : -1;
    PyObject *s = d != NULL && !(dv == -1 && PyErr_Occurred()) ?
                  PyObject_CallOneArg(t->raw_stream, d) : NULL;
    Py_XDECREF(d);
    if (pyret_handle(s, stream) < 0)
        return -1;
    *device = (int)dv;
    return 0;
}

/* 1 capturing, 0 not, -1 error (as capturing: no event into a graph) */
static int b_is_capturing(Timer *t, H stream) {
    if (t->fake)
        return ret_truth(PyObject_CallMethod(t->backend, "is_capturing", NULL));
    int st = 0;
    if (t->c_streamIsCapturing(stream, &st) != 0)
        return -1;
    return st != 0;
}

static int b_new_event(Timer *t, int device, H *ev) {
    if (t->fake)
        return pyret_handle(PyObject_CallMethod(t->backend, "new_event", "i", device), ev);
    if (t->c_ctxSetCurrent != NULL && device >= 0 && device < MAXDEV && t->ctx[device] != NULL) {
        void *cur = NULL;
        if (ctx_get(t, &cur) != 0 || cur != t->ctx[device])
            ctx_set(t, t->ctx[device]);
    }
    H e = 0;
    int rc = t->c_eventCreate(&e, 0);  /* CU_EVENT_DEFAULT: timing enabled */
    if (rc != 0 || e == 0) {
        cuda_err(t, "cuEventCreate", rc);
        return -1;
    }
    *ev = e;
    return 0;
}

static int b_record(Timer *t, H ev, H stream) {
    if (t->fake) {
        PyObject *r = PyObject_CallMethod(t->backend, "record", "KK", (unsigned long long)ev,
                                          (unsigned long long)stream);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    int rc = t->c_eventRecord(ev, stream);
    if (rc != 0) {
        cuda_err(t, "cuEventRecord", rc);
        return -1;
    }
    return 0;
}

/* 1 completed, 0 not (or an error: never read as done) */
static int b_query(Timer *t, H ev) {
    if (t->fake)
        return ret_truth(PyObject_CallMethod(t->backend, "query", "K", (unsigned long long)ev));
    return t->c_eventQuery(ev) == 0;
}

static int b_elapsed_ms(Timer *t, H a, H b, double *ms) {
    if (t->fake)
        return ret_double(PyObject_CallMethod(t->backend, "elapsed_ms", "KK",
                                              (unsigned long long)a, (unsigned long long)b), ms);
    float f = 0;
    int rc = t->c_eventElapsed(&f, a, b);
    if (rc != 0) {
        cuda_err(t, "cuEventElapsedTime", rc);
        return -1;
    }
    *ms = (double)f;
    return 0;
}

static int b_calibration_stream(Timer *t, int device, H *stream) {
    if (device < 0 || device >= MAXDEV)
        return -1;
    if (t->has_cal_stream[device]) {
        *stream = t->cal_stream[device];
        return 0;
    }
    H s = 0;
    if (t->fake) {
        if (pyret_handle(PyObject_CallMethod(t->backend, "calibration_stream", "i", device),
                         &s) < 0)
            return -1;
    } else {
        if (t->ctx[device] == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "no CUDA context seen for the device yet");
            return -1;
        }
        ctx_set(t, t->ctx[device]);
        int rc = t->c_streamCreate(&s, 1);  /* CU_STREAM_NON_BLOCKING */
        if (rc != 0) {
            cuda_err(t, "cuStreamCreate", rc);
            return -1;
        }
    }
    t->cal_stream[device] = s;
    t->has_cal_stream[device] = 1;
    *stream = s;
    return 0;
}

/* Spin on query for at most max_ns (real time), the GIL released between tries; never a
 * blocking synchronize (device.py's _CudaBackend.wait_event says why). 1 done, 0 not, -1 err */
static int b_wait_event(Timer *t, H ev, long long max_ns) {
    if (t->fake)
        return ret_truth(PyObject_CallMethod(t->backend, "wait_event", "KL",
                                             (unsigned long long)ev, max_ns));
    int done = 0;
    long long deadline = mono_ns() + max_ns;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        if (t->c_eventQuery(ev) == 0) {
            done = 1;
            break;
        }
        if (mono_ns() > deadline)
            break;
        sched_yield();
    }
    Py_END_ALLOW_THREADS
    return done;
}

/* The host clock (ns): the clock callable, or CLOCK_REALTIME. 0 with *out, -1 on error. */
static int host_now(Timer *t, long long *out) {
    if (t->clock == NULL || t->clock == Py_None) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        *out = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(t->clock);
    if (r == NULL)
        return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* The clock of issue times and their timeouts: the host clock on the Python backend (the
 * tests' fake clock), CLOCK_MONOTONIC on CUDA (no Python call per op). */
static int tick_now(Timer *t, long long *out) {
    if (t->fake)
        return host_now(t, out);
    *out = mono_ns();
    return 0;
}

/* -- pool, calibrations (under mu) ----------------------------------------------------------- */

static int pool_push(Pool *p, H ev) {
    if (p->n == p->cap) {
        Py_ssize_t nc = p->cap ? p->cap * 2 : 64;
        H *v = PyMem_RawRealloc(p->v, nc * sizeof(H));
        if (v == NULL)
            return -1;
        p->v = v;
        p->cap = nc;
    }
    p->v[p->n++] = ev;
    return 0;
}

/* An event of the device from the pool (*ev != 0), or *ev = 0: the caller creates one. */
static void pool_take(Timer *t, int device, H *ev) {
    Pool *p = &t->pools[device];
    *ev = p->n ? p->v[--p->n] : 0;
}

static void release4(Timer *t, int device, H a, H b, H c, H d) {
    Pool *p = &t->pools[device];
    if (a) pool_push(p, a);
    if (b) pool_push(p, b);
    if (c) pool_push(p, c);
    if (d) pool_push(p, d);
}

static Calib *cal_get(Timer *t, long long index) {
    if (index <= 0)
        return NULL;
    for (Py_ssize_t i = 0; i < t->ncal; i++)
        if (t->cals[i].index == index)
            return &t->cals[i];
    return NULL;
}

/* _acquire(device) under mu, then (outside mu) a new event if the pool was empty. The GIL is
 * held (the Python backend, events_created). 0 ok, -1 error. */
static int acquire(Timer *t, int device, H *ev) {
    if (device < 0 || device >= MAXDEV) {
        PyErr_Format(PyExc_ValueError, "device index %d out of range", device);
        return -1;
    }
    LOCK(t);
    pool_take(t, device, ev);
    UNLOCK(t);
    if (*ev)
        return 0;
    t->events_created++;
    return b_new_event(t, device, ev);
}

/* -- Tok ------------------------------------------------------------------------------------- */

static void tok_unlink(Timer *t, Tok *k) {   /* under mu */
    if (!k->linked)
        return;
    if (k->prev) k->prev->next = k->next; else t->head = k->next;
    if (k->next) k->next->prev = k->prev; else t->tail = k->prev;
    k->prev = k->next = NULL;
    k->linked = 0;
    t->ntok--;
    Py_DECREF(k);   /* the list's reference (the caller still holds one) */
}

static int tok_traverse(Tok *k, visitproc visit, void *arg) {
    Py_VISIT((PyObject *)k->timer);
    return 0;
}

static int tok_clear(Tok *k) {
    PyObject *tm = (PyObject *)k->timer;
    k->timer = NULL;
    Py_XDECREF(tm);
    return 0;
}

static void tok_dealloc(Tok *k) {
    PyObject_GC_UnTrack(k);
    tok_clear(k);
    PyObject_GC_Del(k);
}

/* an event handle as the backend's object (Python backend), or the handle */
static PyObject *handle_obj(Timer *t, H h, int is_event) {
    if (is_event && h == 0)
        Py_RETURN_NONE;
    if (t != NULL && t->fake)
        return PyObject_CallMethod(t->backend, "obj", "K", (unsigned long long)h);
    return PyLong_FromUnsignedLongLong((unsigned long long)h);
}

static PyObject *tok_get_start(Tok *k, void *c) { return handle_obj(k->timer, k->start, 1); }
static PyObject *tok_get_end(Tok *k, void *c) { return handle_obj(k->timer, k->end, 1); }
static PyObject *tok_get_wait_begin(Tok *k, void *c) {
    return handle_obj(k->timer, k->wait_begin, 1);
}
static PyObject *tok_get_done(Tok *k, void *c) { return handle_obj(k->timer, k->done, 1); }
static PyObject *tok_get_stream(Tok *k, void *c) { return handle_obj(k->timer, k->stream, 0); }
static PyObject *tok_get_calib(Tok *k, void *c) {
    if (k->calib <= 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(k->calib);
}
static PyObject *tok_get_blocking(Tok *k, void *c) {
    if (k->blocking < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(k->blocking);
}

static PyGetSetDef tok_getset[] = {
    {"start", (getter)tok_get_start, NULL, NULL, NULL},
    {"end", (getter)tok_get_end, NULL, NULL, NULL},
    {"wait_begin", (getter)tok_get_wait_begin, NULL, NULL, NULL},
    {"done", (getter)tok_get_done, NULL, NULL, NULL},
    {"stream", (getter)tok_get_stream, NULL, NULL, NULL},
    {"calib", (getter)tok_get_calib, NULL, NULL, NULL},
    {"blocking", (getter)tok_get_blocking, NULL, NULL, NULL},
    {NULL}
};

static PyMemberDef tok_members[] = {
    {"op_id", T_LONGLONG, offsetof(Tok, op_id), READONLY, NULL},
    {"device", T_INT, offsetof(Tok, device), READONLY, NULL},
    {"issued_ns", T_LONGLONG, offsetof(Tok, issued_ns), READONLY, NULL},
    {"returned", T_BOOL, offsetof(Tok, returned), READONLY, NULL},
    {"end_same", T_BOOL, offsetof(Tok, end_same), READONLY, NULL},
    {NULL}
};

static PyTypeObject TokType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._devtimer.Token",
    .tp_basicsize = sizeof(Tok),
    .tp_dealloc = (destructor)tok_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)tok_traverse,
    .tp_clear = (inquiry)tok_clear,
    .tp_doc = "One op's device-timing state (EventTimer's _Token).",
    .tp_getset = tok_getset,
    .tp_members = tok_members,
};

static Tok *as_tok(PyObject *o) {
    return (o != NULL && Py_TYPE(o) == &TokType) ? (Tok *)o : NULL;
}

/* -- training thread ------------------------------------------------------------------------- */

/* The first op of a device (CUDA), in the training thread where the device's context is
 * current: keep the context for the writer thread, make the calibration stream and a few events
 * now. Made by the writer's first poll instead, creating them held the driver while the
 * training thread launched its op (the GPU check's A8 saw its first op take 3 ms more). */
static void prime_device(Timer *t, int dev) {
    void *cx = NULL;
    if (ctx_get(t, &cx) != 0 || cx == NULL)
        return;
    t->ctx[dev] = cx;
    H s = 0;
    if (!t->has_cal_stream[dev] && b_calibration_stream(t, dev, &s) < 0) {
        PyErr_Clear();
        return;
    }
    for (int i = 0; i < t->primed_events; i++) {
        H ev = 0;
        t->events_created++;
        if (b_new_event(t, dev, &ev) < 0) {
            PyErr_Clear();
            return;
        }
        LOCK(t);
        pool_push(&t->pools[dev], ev);
        UNLOCK(t);
    }
}

/* on_issue(op_id): a new reference to the token, or a new reference to None */
static PyObject *issue_ll(Timer *t, long long op_id) {
    H stream = 0, ev = 0;
    int dev = 0;
    if (t->fake) {   /* the Python EventTimer's order of backend calls */
        int cap = b_is_capturing(t, 0);
        if (cap != 0) {
            if (cap < 0) goto fail;
            t->graph_captured_ops++;
            Py_RETURN_NONE;
        }
        if (t->ntok >= t->max_pending) {
            t->dropped++;
            Py_RETURN_NONE;
        }
        if (b_current_stream(t, &stream, &dev) < 0)
            goto fail;
    } else {
        if (b_current_stream(t, &stream, &dev) < 0)
            goto fail;
        int cap = b_is_capturing(t, stream);
        if (cap != 0) {
            /* recording timing events into a graph would make them graph nodes, replayed
             * later with no Python to read them: count the op and skip it (an error of the
             * query, e.g. the legacy stream during a global capture, is read the same way) */
            t->graph_captured_ops++;
            Py_RETURN_NONE;
        }
        if (t->ntok >= t->max_pending) {
            t->dropped++;
            Py_RETURN_NONE;
        }
        if (dev >= 0 && dev < MAXDEV && t->ctx[dev] == NULL)
            prime_device(t, dev);
    }
    if (acquire(t, dev, &ev) < 0)
        goto fail;
    LOCK(t);
    long long latest = t->latest[dev];
    UNLOCK(t);
    if (b_record(t, ev, stream) < 0)
        goto fail;
    long long now;
    if (tick_now(t, &now) < 0)
        goto fail;
    Tok *k = PyObject_GC_New(Tok, &TokType);
    if (k == NULL)
        goto fail;
    k->prev = k->next = NULL;
    Py_INCREF(t);
    k->timer = t;
    k->op_id = op_id;
    k->device = dev;
    k->stream = stream;
    k->start = ev;
    k->end = k->wait_begin = k->done = 0;
    k->blocking = -1;
    k->returned = 0;
    k->calib = latest;
    k->issued_ns = now;
    k->end_same = 0;
    k->linked = 0;
    k->ready = 0;
    PyObject_GC_Track(k);
    LOCK(t);
    /* _tokens[op_id] = tok: an op id seen again (the newest; op ids grow) replaces the older
     * token in its place, as a dict keeps a key's */
    Tok *o = t->tail;
    if (o != NULL && o->op_id == op_id) {
        k->prev = o->prev;
        k->next = o->next;
        if (o->prev) o->prev->next = k; else t->head = k;
        if (o->next) o->next->prev = k; else t->tail = k;
        o->prev = o->next = NULL;
        o->linked = 0;
        k->linked = 1;
        Py_INCREF(k);
        UNLOCK(t);
        Py_DECREF(o);   /* the list's reference */
        return (PyObject *)k;
    }
    k->prev = t->tail;
    if (t->tail) t->tail->next = k; else t->head = k;
    t->tail = k;
    k->linked = 1;
    t->ntok++;
    Py_INCREF(k);
    UNLOCK(t);
    return (PyObject *)k;
fail:
    t_fail(t, "on_issue", NULL);
    Py_RETURN_NONE;
}

static PyObject *t_on_issue(Timer *t, PyObject *arg) {
    long long op_id = PyLong_AsLongLong(arg);
    if (op_id == -1 && PyErr_Occurred()) {
        t_fail(t, "on_issue", NULL);
        Py_RETURN_NONE;
    }
    return issue_ll(t, op_id);
}

static void return_core(Timer *t, Tok *k, int blocking) {
    k->blocking = blocking;
    if (blocking) {
        H ev = 0, stream = 0;
        int dev = 0;
        if (acquire(t, k->device, &ev) < 0)
            goto fail;
        if (b_current_stream(t, &stream, &dev) < 0 || b_record(t, ev, stream) < 0)
            goto fail;
        k->end_same = stream == k->stream;
        __atomic_store_n(&k->end, ev, __ATOMIC_RELEASE);
    }
    k->returned = 1;
    return;
fail:
    t_fail(t, "on_return", NULL);
}

static PyObject *t_on_return(Timer *t, PyObject *const *args, Py_ssize_t n,
                             PyObject *kwnames) {
    PyObject *a[2] = {n > 0 ? args[0] : NULL, n > 1 ? args[1] : NULL};
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int slot = PyUnicode_CompareWithASCIIString(name, "token") == 0 ? 0 :
                   PyUnicode_CompareWithASCIIString(name, "blocking") == 0 ? 1 : -1;
        if (slot < 0 || a[slot] != NULL) {
            PyErr_SetString(PyExc_TypeError, "on_return(token, blocking)");
            return NULL;
        }
        a[slot] = args[n + i];
    }
    if (n > 2 || a[0] == NULL || a[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "on_return(token, blocking)");
        return NULL;
    }
    Tok *k = as_tok(a[0]);
    if (k == NULL)
        Py_RETURN_NONE;
    int blocking = PyObject_IsTrue(a[1]);
    if (blocking < 0) {
        t_fail(t, "on_return", NULL);
        Py_RETURN_NONE;
    }
    return_core(t, k, blocking);
    Py_RETURN_NONE;
}

/* on_wait_begin (which 0), on_wait (1), on_done (2): one event on the current stream */
static PyObject *record_now(Timer *t, PyObject *arg, int which) {
    static const char *names[] = {"on_wait_begin", "on_wait", "on_done"};
    Tok *k = as_tok(arg);
    if (k == NULL)
        Py_RETURN_NONE;
    if (which < 2) {
        if (k->blocking > 0 || k->end)
            Py_RETURN_NONE;
    } else if (k->done || k->blocking > 0) {
        Py_RETURN_NONE;
    }
    H ev = 0, stream = 0;
    int dev = 0;
    if (acquire(t, k->device, &ev) < 0)
        goto fail;
    if (b_current_stream(t, &stream, &dev) < 0 || b_record(t, ev, stream) < 0)
        goto fail;
    if (which == 0) {
        if (k->wait_begin) {   /* a second wait(): keep the first */
            LOCK(t);
            pool_push(&t->pools[k->device], ev);
            UNLOCK(t);
        } else {
            __atomic_store_n(&k->wait_begin, ev, __ATOMIC_RELEASE);
        }
    } else if (which == 1) {
        __atomic_store_n(&k->end, ev, __ATOMIC_RELEASE);
        k->returned = 1;
    } else {
        __atomic_store_n(&k->done, ev, __ATOMIC_RELEASE);
    }
    Py_RETURN_NONE;
fail:
    t_fail(t, names[which], NULL);
    Py_RETURN_NONE;
}

static PyObject *t_on_wait_begin(Timer *t, PyObject *arg) { return record_now(t, arg, 0); }
static PyObject *t_on_wait(Timer *t, PyObject *arg) { return record_now(t, arg, 1); }
static PyObject *t_on_done(Timer *t, PyObject *arg) { return record_now(t, arg, 2); }

static void abandon_core(Timer *t, Tok *k) {
    LOCK(t);
    /* _tokens.pop(token.op_id): the linked token of that op id */
    Tok *o = k->linked ? k : NULL;
    if (o == NULL)
        for (o = t->head; o != NULL && o->op_id != k->op_id; o = o->next)
            ;
    if (o != NULL) {
        Py_INCREF(o);
        tok_unlink(t, o);
        release4(t, k->device, k->start, k->end, k->wait_begin, k->done);
        UNLOCK(t);
        Py_DECREF(o);
    } else {
        UNLOCK(t);
    }
}

static PyObject *t_abandon(Timer *t, PyObject *arg) {
    Tok *k = as_tok(arg);
    if (k != NULL)
        abandon_core(t, k);
    Py_RETURN_NONE;
}

/* -- writer thread ---------------------------------------------------------------------------- */

/* calibrate(device): 1 done, 0 not (device busy), -1 error. GIL held (released in the spin). */
static int calibrate(Timer *t, int device) {
    H stream = 0;
    if (b_calibration_stream(t, device, &stream) < 0)
        return -1;
    long long now;
    if (host_now(t, &now) < 0)
        return -1;
    t->tried[device] = now;
    t->has_tried[device] = 1;
    int have = 0;
    long long best_w = 0, best_mid = 0;
    H best_ev = 0;
    H spare[CALIBRATION_TRIES + 1];
    int nspare = 0, rc = 0;
    for (int i = 0; i < CALIBRATION_TRIES; i++) {
        H ev = 0;
        long long h0, h1;
        if (acquire(t, device, &ev) < 0 || host_now(t, &h0) < 0 || b_record(t, ev, stream) < 0) {
            rc = -1;
            break;
        }
        int w = b_wait_event(t, ev, CALIBRATION_MAX_WAIT_NS);
        if (w < 0) {
            rc = -1;
            break;
        }
        if (!w) {
            t->calibration_failures++;
            break;   /* ev may still complete later: never reuse it */
        }
        if (host_now(t, &h1) < 0) {
            rc = -1;
            break;
        }
        long long width = h1 - h0, mid = (h0 + h1) / 2;
        if ((h0 + h1) % 2 != 0 && (h0 + h1) < 0)
            mid -= 1;   /* floor division, as Python's // */
        if (!have || width < best_w) {
            if (have)
                spare[nspare++] = best_ev;
            have = 1;
            best_w = width;
            best_mid = mid;
            best_ev = ev;
        } else {
            spare[nspare++] = ev;
        }
    }
    LOCK(t);
    for (int i = 0; i < nspare; i++)
        pool_push(&t->pools[device], spare[i]);
    if (!have) {
        UNLOCK(t);
        return rc < 0 ? -1 : 0;
    }
    if (t->ncal == t->capcal) {
        Py_ssize_t nc = t->capcal ? t->capcal * 2 : 8;
        Calib *v = PyMem_RawRealloc(t->cals, nc * sizeof(Calib));
        if (v == NULL) {
            UNLOCK(t);
            return -1;
        }
        t->cals = v;
        t->capcal = nc;
    }
    t->calib_seq++;
    Calib *c = &t->cals[t->ncal++];
    c->index = t->calib_seq;
    c->device = device;
    c->event = best_ev;
    c->host_ns = best_mid;
    c->bracket_ns = best_w;
    t->latest[device] = c->index;
    UNLOCK(t);
    return rc < 0 ? -1 : 1;
}

/* Python's round() of a double: to nearest, ties to even (the default rounding mode) */
static long long round_ns(double ms) {
    return (long long)nearbyint(ms * 1e6);
}

static int to_host(Timer *t, const Calib *c, H ev, long long *out) {
    double ms;
    if (b_elapsed_ms(t, c->event, ev, &ms) < 0)
        return -1;
    *out = c->host_ns + round_ns(ms);
    return 0;
}

/* _calibration_for(tok): a copy of the calibration to map the op with */
static int calibration_for(Timer *t, Tok *k, Calib *out) {
    LOCK(t);
    Calib *latest = cal_get(t, t->latest[k->device]);
    Calib *cal = k->calib > 0 ? cal_get(t, k->calib) : NULL;
    if (latest == NULL) {
        UNLOCK(t);
        return -1;
    }
    if (cal == NULL || cal == latest) {
        *out = *latest;
        UNLOCK(t);
        return 0;
    }
    Calib mine = *cal;
    UNLOCK(t);
    long long t0;
    if (to_host(t, &mine, k->start, &t0) < 0)
        return -1;
    LOCK(t);
    /* newer calibrations of the device, newest first */
    for (Py_ssize_t i = t->ncal - 1; i >= 0; i--) {
        Calib *c = &t->cals[i];
        if (c->device != k->device || c->index <= mine.index)
            continue;
        if (c->host_ns <= t0 - CALIBRATION_MARGIN_NS) {
            *out = *c;
            UNLOCK(t);
            return 0;
        }
    }
    UNLOCK(t);
    *out = mine;
    return 0;
}

static void prune_calibrations(Timer *t) {   /* under mu */
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < t->ncal; i++) {
        Calib c = t->cals[i];
        int keep = 0;
        for (int d = 0; d < MAXDEV && !keep; d++)
            keep = t->latest[d] == c.index;
        for (Tok *k = t->head; k != NULL && !keep; k = k->next)
            keep = k->calib == c.index;
        if (keep)
            t->cals[w++] = c;
        else
            pool_push(&t->pools[c.device], c.event);
    }
    t->ncal = w;
}

/* The query part of poll for one token: sets k->ready and its results. GIL: held on the
 * Python backend, released on CUDA (no Python call then: the handles and calibrations only). */
static int poll_one(Timer *t, Tok *k, long long tnow) {
    k->ready = 0;
    LOCK(t);
    int has_cal = t->latest[k->device] != 0;
    UNLOCK(t);
    if (!has_cal)
        return 0;   /* no calibration yet (device busy): read it later */
    H end = __atomic_load_n(&k->end, __ATOMIC_ACQUIRE);
    H done = __atomic_load_n(&k->done, __ATOMIC_ACQUIRE);
    H wb = __atomic_load_n(&k->wait_begin, __ATOMIC_ACQUIRE);
    Calib cal;
    int q;
    if (!end) {
        if (done && tnow - k->issued_ns >= t->done_grace_ns) {
            /* no wait() through Python: its completion is its end */
            if ((q = b_query(t, done)) <= 0 || (q = b_query(t, k->start)) <= 0)
                return q;
            if (calibration_for(t, k, &cal) < 0 || to_host(t, &cal, k->start, &k->r_t0) < 0 ||
                to_host(t, &cal, done, &k->r_t1) < 0)
                return -1;
            k->r_has_t1 = 1;
            k->r_has_sw = 0;
            k->ready = 1;
            return 0;
        }
        if (tnow - k->issued_ns < t->unwaited_timeout_ns)
            return 0;
        /* never waited (or the call raised): its start only, its events freed */
        if ((q = b_query(t, k->start)) <= 0)
            return q;
        if (calibration_for(t, k, &cal) < 0 || to_host(t, &cal, k->start, &k->r_t0) < 0)
            return -1;
        k->r_has_t1 = 0;
        k->r_has_sw = 0;
        k->ready = 1;
        return 0;
    }
    /* (stream order: an end on the start's stream completes after the start) */
    if ((q = b_query(t, end)) <= 0)
        return q;
    if (!k->end_same && (q = b_query(t, k->start)) <= 0)
        return q;
    if (wb && (q = b_query(t, wb)) <= 0)
        return q;
    if (calibration_for(t, k, &cal) < 0 || to_host(t, &cal, k->start, &k->r_t0) < 0 ||
        to_host(t, &cal, end, &k->r_t1) < 0)
        return -1;
    k->r_has_t1 = 1;
    k->r_has_sw = 0;
    if (wb) {
        double ms;
        if (b_elapsed_ms(t, wb, end, &ms) < 0)
            return -1;
        long long sw = round_ns(ms);
        k->r_sw = sw > 0 ? sw : 0;
        k->r_has_sw = 1;
    }
    k->ready = 1;
    return 0;
}

static PyObject *t_poll(Timer *t, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Tok **toks = NULL;
    Py_ssize_t n = 0;
    LOCK(t);
    if (t->ntok > 0) {
        toks = PyMem_RawMalloc(t->ntok * sizeof(Tok *));
        if (toks != NULL)
            for (Tok *k = t->head; k != NULL; k = k->next) {
                Py_INCREF(k);
                toks[n++] = k;
            }
    }
    UNLOCK(t);
    if (n == 0) {
        PyMem_RawFree(toks);
        return out;
    }
    const char *where = "poll";
    long long now, tnow;
    if (!t->fake && t->c_ctxGetCurrent != NULL) {
        /* the driver API reads events in a context: the writer thread has none of its own
         * (the runtime binds one lazily, the driver does not) */
        void *cur = NULL;
        if (ctx_get(t, &cur) != 0 || cur == NULL) {
            int d = toks[0]->device;
            if (d >= 0 && d < MAXDEV && t->ctx[d] != NULL)
                ctx_set(t, t->ctx[d]);
        }
    }
    if (host_now(t, &now) < 0 || tick_now(t, &tnow) < 0)
        goto fail;
    {
        /* calibrate the devices seen, in ascending order (as a set of small ints iterates) */
        char seen[MAXDEV];
        memset(seen, 0, sizeof(seen));
        for (Py_ssize_t i = 0; i < n; i++)
            if (toks[i]->device >= 0 && toks[i]->device < MAXDEV)
                seen[toks[i]->device] = 1;
        for (int d = 0; d < MAXDEV; d++) {
            if (!seen[d])
                continue;
            LOCK(t);
            Calib *cal = cal_get(t, t->latest[d]);
            long long cal_host = cal ? cal->host_ns : 0;
            UNLOCK(t);
            int has_tried = t->has_tried[d];
            long long tried = t->tried[d];
            if ((cal == NULL || now - cal_host >= t->calibration_interval_ns) &&
                (!has_tried || now - tried >= t->calibration_interval_ns ||
                 (cal == NULL && now - tried >= CALIBRATION_MAX_WAIT_NS * 50))) {
                if (calibrate(t, d) < 0)
                    goto fail;
            }
        }
    }
    int err = 0;
    if (t->fake) {
        for (Py_ssize_t i = 0; i < n && !err; i++)
            err = poll_one(t, toks[i], tnow) < 0;
    } else {
        t->err_what = NULL;
        Py_BEGIN_ALLOW_THREADS
        tl_nogil = 1;
        for (Py_ssize_t i = 0; i < n && !err; i++)
            err = poll_one(t, toks[i], tnow) < 0;
        tl_nogil = 0;
        Py_END_ALLOW_THREADS
    }
    if (err) {
        if (!t->fake && !PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "%s failed: CUDA error %d",
                         t->err_what ? t->err_what : "reading CUDA events", t->err_rc);
        goto fail;
    }
    {
        int any = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Tok *k = toks[i];
            if (!k->ready)
                continue;
            any = 1;
            PyObject *row = Py_BuildValue(
                "(LLNN)", k->op_id, k->r_t0,
                k->r_has_t1 ? PyLong_FromLongLong(k->r_t1) : Py_NewRef(Py_None),
                k->r_has_sw ? PyLong_FromLongLong(k->r_sw) : Py_NewRef(Py_None));
            if (row == NULL || PyList_Append(out, row) < 0) {
                Py_XDECREF(row);
                goto fail;
            }
            Py_DECREF(row);
        }
        if (any) {
            LOCK(t);
            for (Py_ssize_t i = 0; i < n; i++) {
                Tok *k = toks[i];
                if (!k->ready)
                    continue;
                k->ready = 0;
                if (k->linked) {
                    tok_unlink(t, k);
                    release4(t, k->device, k->start, k->end, k->wait_begin, k->done);
                }
            }
            prune_calibrations(t);
            UNLOCK(t);
        }
    }
    goto done;
fail:
    t_fail(t, where, NULL);
    /* the rows read before the error stay unreturned (EventTimer returns what it had) */
    for (Py_ssize_t i = 0; i < n; i++)
        toks[i]->ready = 0;
done:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(toks[i]);
    PyMem_RawFree(toks);
    return out;
}

static PyObject *t_calibrate(Timer *t, PyObject *arg) {
    long d = PyLong_AsLong(arg);
    if ((d == -1 && PyErr_Occurred()) || d < 0 || d >= MAXDEV) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "device index out of range");
        return NULL;
    }
    int r = calibrate(t, (int)d);
    if (r < 0) {
        t_fail(t, "calibrate", NULL);
        Py_RETURN_NONE;
    }
    if (r == 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(t->latest[d]);
}

static PyObject *t_pending(Timer *t, PyObject *unused) {
    return PyLong_FromLongLong(t->ntok);
}

static PyObject *t_pooled(Timer *t, PyObject *unused) {
    long long s = 0;
    LOCK(t);
    for (int d = 0; d < MAXDEV; d++)
        s += t->pools[d].n;
    UNLOCK(t);
    return PyLong_FromLongLong(s);
}

/* [(index, device, event, host_ns, bracket_ns, is_latest)] (the events as the backend's) */
static PyObject *t_calibrations(Timer *t, PyObject *unused) {
    LOCK(t);
    Py_ssize_t n = t->ncal;
    Calib *copy = PyMem_RawMalloc((n ? n : 1) * sizeof(Calib));
    if (copy != NULL)
        memcpy(copy, t->cals, n * sizeof(Calib));
    long long latest[MAXDEV];
    memcpy(latest, t->latest, sizeof(latest));
    UNLOCK(t);
    if (copy == NULL)
        return PyErr_NoMemory();
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        Calib *c = &copy[i];
        PyObject *ev = handle_obj(t, c->event, 1);
        PyObject *row = ev ? Py_BuildValue("(LiNLLO)", c->index, c->device, ev, c->host_ns,
                                           c->bracket_ns,
                                           latest[c->device] == c->index ? Py_True : Py_False)
                           : NULL;
        if (row == NULL || PyList_Append(out, row) < 0)
            Py_CLEAR(out);
        Py_XDECREF(row);
    }
    PyMem_RawFree(copy);
    return out;
}

static PyObject *t_stats(Timer *t, PyObject *unused) {
    return Py_BuildValue("{sLsLsLsLsLsL}", "graph_captured_ops", t->graph_captured_ops,
                         "events_created", t->events_created, "dropped", t->dropped,
                         "errors", t->errors, "calibrations", t->calib_seq,
                         "calibration_failures", t->calibration_failures);
}

/* -- the type --------------------------------------------------------------------------------- */

static int t_init(Timer *t, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"backend", "fns", "get_device", "raw_stream", "clock",
                             "calibration_interval_ns", "max_pending", "unwaited_timeout_ns",
                             "done_grace_ns", "fail_cb", "api", NULL};
    PyObject *backend = Py_None, *fns = Py_None, *get_device = Py_None, *raw_stream = Py_None,
             *clock = Py_None, *fail_cb = Py_None;
    long long ci = 1000000000LL, mp = 65536, ut = 600000000000LL, dg = 1000000000LL;
    const char *api = "driver";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOOOLLLLOs", kwlist, &backend, &fns,
                                     &get_device, &raw_stream, &clock, &ci, &mp, &ut, &dg,
                                     &fail_cb, &api))
        return -1;
    if (strcmp(api, "driver") != 0 && strcmp(api, "runtime") != 0) {
        PyErr_Format(PyExc_ValueError, "api must be 'driver' or 'runtime', not '%s'", api);
        return -1;
    }
    t->rt = strcmp(api, "runtime") == 0;
    if (t->backend != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Timer already initialised");
        return -1;
    }
    t->fake = backend != Py_None;
    if (!t->fake) {
        /* fns: (cuEventCreate, cuEventRecord, cuEventQuery, cuEventElapsedTime,
         *       cuStreamIsCapturing, cuCtxGetCurrent, cuCtxSetCurrent, cuStreamCreate), or for
         * api="runtime" (cudaEventCreateWithFlags, cudaEventRecord, cudaEventQuery,
         *       cudaEventElapsedTime, cudaStreamIsCapturing, cudaGetDevice, cudaSetDevice,
         *       cudaStreamCreateWithFlags): the same signatures but the device pair */
        if (!PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) != 8 || !PyCallable_Check(get_device)
            || !PyCallable_Check(raw_stream)) {
            PyErr_SetString(PyExc_TypeError,
                            "Timer needs a backend, or the 8 CUDA driver functions and torch's "
                            "_cuda_getDevice and _cuda_getCurrentRawStream");
            return -1;
        }
        void *p[8];
        for (int i = 0; i < 8; i++) {
            p[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, i));
            if (p[i] == NULL) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "CUDA driver function %d is NULL", i);
                return -1;
            }
        }
        t->c_eventCreate = (f_eventCreate)p[0];
        t->c_eventRecord = (f_eventRecord)p[1];
        t->c_eventQuery = (f_eventQuery)p[2];
        t->c_eventElapsed = (f_eventElapsed)p[3];
        t->c_streamIsCapturing = (f_streamIsCapturing)p[4];
        t->c_ctxGetCurrent = (f_ctxGetCurrent)p[5];
        t->c_ctxSetCurrent = (f_ctxSetCurrent)p[6];
        t->c_streamCreate = (f_streamCreate)p[7];
    }
    Py_INCREF(backend);
    t->backend = backend;
    Py_INCREF(get_device);
    t->get_device = get_device;
    Py_INCREF(raw_stream);
    t->raw_stream = raw_stream;
    Py_INCREF(clock);
    t->clock = clock;
    Py_INCREF(fail_cb);
    t->fail_cb = fail_cb;
    t->calibration_interval_ns = ci;
    t->max_pending = mp;
    t->unwaited_timeout_ns = ut;
    t->done_grace_ns = dg;
    t->primed_events = 5;   /* a blocking op's two, three calibration tries */
    return 0;
}

static PyObject *t_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Timer *t = (Timer *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    pthread_mutex_init(&t->mu, NULL);
    return (PyObject *)t;
}

static int t_traverse(Timer *t, visitproc visit, void *arg) {
    for (Tok *k = t->head; k != NULL; k = k->next)
        Py_VISIT((PyObject *)k);
    Py_VISIT(t->dict);
    Py_VISIT(t->backend);
    Py_VISIT(t->clock);
    Py_VISIT(t->fail_cb);
    Py_VISIT(t->get_device);
    Py_VISIT(t->raw_stream);
    return 0;
}

static void unlink_all(Timer *t) {
    /* detach the list first: a token freed below may drop the last reference to t */
    Tok *k = t->head;
    t->head = t->tail = NULL;
    t->ntok = 0;
    while (k != NULL) {
        Tok *next = k->next;
        k->prev = k->next = NULL;
        k->linked = 0;
        Py_DECREF(k);
        k = next;
    }
}

static int t_clear(Timer *t) {
    unlink_all(t);
    Py_CLEAR(t->dict);
    Py_CLEAR(t->backend);
    Py_CLEAR(t->clock);
    Py_CLEAR(t->fail_cb);
    Py_CLEAR(t->get_device);
    Py_CLEAR(t->raw_stream);
    return 0;
}

static void t_dealloc(Timer *t) {
    PyObject_GC_UnTrack(t);
    /* tokens still linked: unlink (their events are not destroyed: a live CUDA context may be
     * gone at exit; the driver frees them with the context) */
    unlink_all(t);
    for (int d = 0; d < MAXDEV; d++)
        PyMem_RawFree(t->pools[d].v);
    PyMem_RawFree(t->cals);
    t_clear(t);
    pthread_mutex_destroy(&t->mu);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef t_methods[] = {
    {"on_issue", (PyCFunction)t_on_issue, METH_O, "Record the start event of op `op_id`: a token, or None."},
    {"on_return", (PyCFunction)(void (*)(void))t_on_return, METH_FASTCALL | METH_KEYWORDS, "on_return(token, blocking)."},
    {"on_wait_begin", (PyCFunction)t_on_wait_begin, METH_O, "Event before work.wait()."},
    {"on_wait", (PyCFunction)t_on_wait, METH_O, "Event after work.wait(): the async op's end."},
    {"on_done", (PyCFunction)t_on_done, METH_O, "Event in the future's callback: its completion."},
    {"abandon", (PyCFunction)t_abandon, METH_O, "Forget an op whose end will never be recorded."},
    {"_poll", (PyCFunction)t_poll, METH_NOARGS, "Read back completed ops (writer thread)."},
    {"calibrate", (PyCFunction)t_calibrate, METH_O, "Calibrate a device: the index, or None."},
    {"pending", (PyCFunction)t_pending, METH_NOARGS, "Ops whose times are not read back yet."},
    {"pooled", (PyCFunction)t_pooled, METH_NOARGS, "Events idle in the pool."},
    {"calibrations", (PyCFunction)t_calibrations, METH_NOARGS, "The live calibrations."},
    {"stats", (PyCFunction)t_stats, METH_NOARGS, "Counters for the rank metadata."},
    {NULL}
};

static PyMemberDef t_members[] = {
    {"clock", T_OBJECT, offsetof(Timer, clock), 0, "host clock (ns) callable, or None"},
    {"fail_cb", T_OBJECT, offsetof(Timer, fail_cb), 0, NULL},
    {"_b", T_OBJECT, offsetof(Timer, backend), READONLY, "the Python backend (tests)"},
    {"calibration_interval_ns", T_LONGLONG, offsetof(Timer, calibration_interval_ns), 0, NULL},
    {"max_pending", T_LONGLONG, offsetof(Timer, max_pending), 0, NULL},
    {"unwaited_timeout_ns", T_LONGLONG, offsetof(Timer, unwaited_timeout_ns), 0, NULL},
    {"done_grace_ns", T_LONGLONG, offsetof(Timer, done_grace_ns), 0, NULL},
    {"graph_captured_ops", T_LONGLONG, offsetof(Timer, graph_captured_ops), READONLY, NULL},
    {"events_created", T_LONGLONG, offsetof(Timer, events_created), READONLY, NULL},
    {"dropped", T_LONGLONG, offsetof(Timer, dropped), READONLY, NULL},
    {"errors", T_LONGLONG, offsetof(Timer, errors), READONLY, NULL},
    {"calibration_failures", T_LONGLONG, offsetof(Timer, calibration_failures), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(Timer, dict), READONLY},
    {NULL}
};

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._devtimer.Timer",
    .tp_basicsize = sizeof(Timer),
    .tp_dealloc = (destructor)t_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "EventTimer in C (commtrace/capture/device.py: CEventTimer).",
    .tp_traverse = (traverseproc)t_traverse,
    .tp_clear = (inquiry)t_clear,
    .tp_methods = t_methods,
    .tp_members = t_members,
    .tp_init = (initproc)t_init,
    .tp_new = t_new,
    .tp_dictoffset = offsetof(Timer, dict),
};

/* -- a fake CUDA driver, for tests: the CUDA backend's code (poll with the GIL released, the
 * context calls, the events' atomic stores) run on the CPU under threads ---------------------
 * An event completes FAKE_LATENCY_NS after it was recorded; a record stamps CLOCK_MONOTONIC. */
#define FAKE_LATENCY_NS 20000LL
typedef struct { long long t; int recorded; } FakeEv;

static int fk_event_create(H *ev, unsigned flags) {
    FakeEv *e = PyMem_RawCalloc(1, sizeof(FakeEv));
    if (e == NULL)
        return 2;   /* CUDA_ERROR_OUT_OF_MEMORY */
    *ev = (H)e;
    return 0;
}
static int fk_event_record(H ev, H stream) {
    FakeEv *e = (FakeEv *)ev;
    __atomic_store_n(&e->recorded, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->t, mono_ns(), __ATOMIC_RELEASE);
    __atomic_store_n(&e->recorded, 1, __ATOMIC_RELEASE);
    return 0;
}
static int fk_done(FakeEv *e) {
    return __atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE) &&
           mono_ns() >= __atomic_load_n(&e->t, __ATOMIC_ACQUIRE) + FAKE_LATENCY_NS;
}
static int fk_event_query(H ev) {
    return fk_done((FakeEv *)ev) ? 0 : CUDA_ERROR_NOT_READY;
}
static int fk_event_elapsed(float *ms, H a, H b) {
    FakeEv *x = (FakeEv *)a, *y = (FakeEv *)b;
    if (!fk_done(x) || !fk_done(y))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)(y->t - x->t) / 1e6);
    return 0;
}
static int fk_stream_is_capturing(H stream, int *status) { *status = 0; return 0; }
static int fk_ctx_get(void **ctx) { *ctx = (void *)0x1; return 0; }
static int fk_ctx_set(void *ctx) { return ctx == (void *)0x1 ? 0 : 201; }
static int fk_stream_create(H *stream, unsigned flags) { *stream = 99; return 0; }

static PyObject *fake_driver(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(NNNNNNNN)", PyLong_FromVoidPtr((void *)fk_event_create),
                         PyLong_FromVoidPtr((void *)fk_event_record),
                         PyLong_FromVoidPtr((void *)fk_event_query),
                         PyLong_FromVoidPtr((void *)fk_event_elapsed),
                         PyLong_FromVoidPtr((void *)fk_stream_is_capturing),
                         PyLong_FromVoidPtr((void *)fk_ctx_get),
                         PyLong_FromVoidPtr((void *)fk_ctx_set),
                         PyLong_FromVoidPtr((void *)fk_stream_create));
}

static PyMethodDef mod_methods[] = {
    {"_fake_driver", fake_driver, METH_NOARGS,
     "Function pointers of a fake CUDA driver (tests): events complete 20 us after record."},
    {NULL}
};

/* -- the C API: _fastpath times a blocking CUDA op without a Python call (capsule _C_API) -- */

/* (mirrored in _fastpath.c, which has no header of this module: `version` guards the layout) */
typedef struct {
    int version;
    PyTypeObject *type;
    /* a new reference to the op's token, or NULL (no token: capturing, dropped, an error);
     * never leaves a Python error set */
    PyObject *(*on_issue)(PyObject *timer, long long op_id);
    void (*on_return)(PyObject *timer, PyObject *token, int blocking);
    void (*abandon)(PyObject *timer, PyObject *token);
} DevTimerApi;

static PyObject *api_on_issue(PyObject *timer, long long op_id) {
    PyObject *r = issue_ll((Timer *)timer, op_id);
    if (r == Py_None) {
        Py_DECREF(r);
        return NULL;
    }
    if (r == NULL)
        PyErr_Clear();
    return r;
}

static void api_on_return(PyObject *timer, PyObject *token, int blocking) {
    Tok *k = as_tok(token);
    if (k != NULL)
        return_core((Timer *)timer, k, blocking);
}

static void api_abandon(PyObject *timer, PyObject *token) {
    Tok *k = as_tok(token);
    if (k != NULL)
        abandon_core((Timer *)timer, k);
}

static DevTimerApi c_api = {1, &TimerType, api_on_issue, api_on_return, api_abandon};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_devtimer",
    "commtrace's device timer in C (CUDA driver events; a Python backend for tests).", -1,
    mod_methods,
};

PyMODINIT_FUNC PyInit__devtimer(void) {
    if (PyType_Ready(&TokType) < 0 || PyType_Ready(&TimerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TimerType);
    Py_INCREF(&TokType);
    if (PyModule_AddObject(m, "Timer", (PyObject *)&TimerType) < 0 ||
        PyModule_AddObject(m, "Token", (PyObject *)&TokType) < 0 ||
        PyModule_AddIntConstant(m, "MAXDEV", MAXDEV) < 0 ||
        PyModule_AddObject(m, "_C_API", PyCapsule_New(&c_api, "commtrace._devtimer._C_API",
                                                       NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
