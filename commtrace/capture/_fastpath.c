/* The blocking fast path of commtrace's torch.distributed wrappers, in C.
 *
 * Optional: when this module is not built (no compiler) or COMMTRACE_PURE_PYTHON=1, the pure
 * Python fast path in wrappers.make_wrapper does the same work. Both produce the same short
 * record ``pre`` (recorder.F_* fields) and queue ``(pre, t_return_ns)`` for the writer thread,
 * which expands it (recorder.expand). Anything this code does not handle itself (tracing off
 * is handled here; async ops, object collectives, NVTX tool attached, device timer, injected
 * clock skew, coalescing, nested calls, recv from any source, an argument it cannot read) is
 * handed to the Python wrapper (`ctx.slow`) before the user's call runs, so the semantics are
 * the Python wrapper's. Errors of commtrace's own bookkeeping are cleared and never raised:
 * the user's call runs, and its result or exception passes through unchanged.
 */
/* Calls into libpython and libc through the GOT, not the PLT (GCC's -fno-plt): each distinct
 * function a blocking op calls then costs no PLT stub line of code. At 2 ranks every op starts
 * on cold caches; callgrind counted 68 -> 61 instruction lines of this module's own code per
 * blocking op (benchmarks/footprint.py, issue 20, session 31). The module is loaded with
 * RTLD_NOW, as every extension module, so nothing is bound later than before. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#pragma GCC optimize("no-plt")
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <pythread.h>
#include <structmember.h>
#include <limits.h>
/* 3.11: the caller's code object and instruction offset straight from its interpreter frame
 * (call_site, below). PyEval_GetFrame() makes a frame object for a frame that has none (one
 * allocation and one free per op: the caller's frame is new at each call of a Python
 * function) and is only needed when the call site is not cached yet. The internal header is
 * the layout of that frame (as Cython includes it); 3.12 and later take the public API. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(PYPY_VERSION)
#define CT_IFRAME 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#define CT_UNDEF_BUILD_CORE 1
#endif
#include <internal/pycore_frame.h>
#ifdef CT_UNDEF_BUILD_CORE
#undef Py_BUILD_CORE
#undef CT_UNDEF_BUILD_CORE
#endif
#else
#define CT_IFRAME 0
#endif

/* Clear a pending error of commtrace's own (the check is cheaper than the clear). */
#define CLEAR_ERR() do { if (PyErr_Occurred()) PyErr_Clear(); } while (0)

/* The blocking path's footprint (issue 20, session 14): at 2 ranks every op starts on cold
 * caches, so what it costs is mostly the number of distinct lines of code and data it touches.
 * LIKELY / UNLIKELY lay the common case out in one straight run; COLD moves first-sight, error
 * and rare-feature code out of line (GCC's .text.unlikely); HOT_DATA gathers the globals that
 * every blocking op reads or writes into one section of a few lines, not spread over the
 * module's data among tables that are used rarely. */
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define COLD __attribute__((cold, noinline))
#define NOINLINE __attribute__((noinline))
#define HOT_DATA __attribute__((section(".data.commtrace_hot")))

/* A dict's version tag (PEP 509): CPython gives every modification of any dict a new,
 * process-unique value, so an unchanged tag means the same keys and the same value objects.
 * The wrapper's entry checks (recorder, thread state, NVTX, device timer, step) keep their
 * last answers with the tags they were read under and redo the lookups only when a tag moved:
 * after a blocking op's wait the caches are cold and each lookup is four or five distinct
 * lines (dict, keys, index, entry, key), reading the tag is one (docs/performance.md).
 * Only up to 3.11: from 3.12 the tag is deprecated and an instance's attributes can be stored
 * beside a materialized __dict__, so there every call does the lookups, as before. */
#if PY_VERSION_HEX < 0x030C0000
#define HAVE_DVER 1
#define DVER(d) (((PyDictObject *)(d))->ma_version_tag)
#else
#define HAVE_DVER 0
#define DVER(d) ((uint64_t)0)
#endif
#include <time.h>
#include <signal.h>

/* The wrapper's context. The fields a blocking op reads on the fast path come first, next to
 * the header and `vectorcall` that CPython reads to call it: at 2 ranks every op starts on cold
 * caches, and these fields then cost three or four memory lines, not the six or seven they did
 * spread over the struct (issue 20, session 14). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    /* -- read by every call on the fast path: three lines (ctx_new aligns the object to a
     * line; four or five from malloc's 16 bytes before session 19) -- */
    PyObject *recmod_d, *nvtx_d;  /* recorder's and nvtx_ranges' module __dict__ (fast_attr) */
    PyObject *last_key;    /* the group of the last call, and its PgInfo facts */
    unsigned long long last_gen;
    PyObject *last_name;
    /* The keyword names of the last call with keywords (strong: a tuple, so the same object
     * has the same names), and where in it the slots g, x, y, a are (kw_j; -1: not given): a
     * call site's keywords are one constant tuple, so a blocking op does not read the tuple or
     * its strings (slot_k; issue 20, session 19). */
    PyObject *kw_tup;
    PyObject *g_n, *g_d, *a_n, *a_d;   /* argument names and defaults */
    PyObject *orig;        /* torch's function */
    PyObject *last_dev;    /* dev_names[last_dev_v] (strong, and kept: keep_obj), or NULL */
    long long last_dev_v;
    PyObject *last_dtype;  /* the last dtype the C++ reads gave (kept: keep_obj), or NULL */
    Py_ssize_t last_slot;     /* its seq slot (recorder.seq_slot), -1: none */
    int g_i, x_i, a_i;        /* argument positions */
    int last_idx;
    int fact_i;
    signed char kw_j[4];
    char last_tseq;           /* its torch seq is read around calls (PgInfo.tseq) */
    char last_p2p1;           /* its p2p ops issue one torch seq each (PgInfo.p2p_one) */
    char has_y;               /* a second (output) tensor argument: out_bytes = y.nbytes */
    char has_root;            /* r0/r1 are (global root, group root) */
    char has_peer;            /* r0/r1 are (global peer, group peer) */
    char is_send;
    char always_async;        /* isend / irecv: every call is async (ApiSpec.always_async) */
    /* Statistics (counts(), meta_reads(): summed over the live contexts, plus n_dead_*):
     * here, in a line the op reads anyway, not in H's (issue 20, session 20). */
    unsigned long long n_fast;   /* calls recorded here */
    unsigned long long n_meta_t; /* tensor reads the C++ reads answered */
    /* -- the rest: first sight, other ops, slow paths -- */
    void *raw;             /* what ctx_new allocated (ctx_dealloc frees it) */
    PyObject *last_info;
    PyObject *x_n, *x_d;
    PyObject *dev_names;   /* device index -> name */
    PyObject *dict;        /* attributes (functools.update_wrapper, __commtrace_original__) */
    PyObject *slow;        /* the Python wrapper: slow(*args, **kwargs) */
    PyObject *on_error;    /* on_error(rec, pre, t1, exc) */
    PyObject *recmod;      /* commtrace.capture.recorder (its _recorder) */
    PyObject *tls;         /* wrappers.tls (threading.local) */
    PyObject *pg_cache;    /* dict: group -> PgInfo */
    PyObject *world;       /* object with _default_pg */
    PyObject *nvtx;        /* nvtx_ranges module (its `active`) */
    PyObject *time_ns;     /* time.time_ns: rec.now_ns must be it (no skew) */
    PyObject *code_internal; /* sites._code_internal: id(code) -> bool */
    PyObject *site_pairs;  /* sites._site_pairs: (id(code), lasti) -> (file, line) */
    PyObject *site_of_frame; /* sites.site_of_frame(frame) */
    PyObject *world_d;     /* world's __dict__ (fast_attr) */
    PyObject *fact;        /* int: index in recorder.FAST_SPECS */
    int y_i, r0_i, r1_i;
    PyObject *y_n, *y_d, *r0_n, *r0_d, *r1_n, *r1_d;
    /* The async path (as_issue): the Work type whose ops are tracked in C, once the Python
     * _track_work has seen one of them complete through a future (strong ref), else NULL. */
    PyObject *as_work_type;
    /* Its Works have no future and only wait() ends them (recorder.WAIT_ONLY: gloo's
     * isend / irecv): the backend they were learned on, else NULL. */
    PyObject *as_nofut_backend;
    /* The key of its last p2p op in rec.p2p_seq, (group name, src, dst), and its hash (see
     * p2p_seq_next); NULL before the first. */
    PyObject *p2p_key;
    Py_hash_t p2p_hash;
} FastCtx;

/* Interned names. */
static PyObject *s_recorder, *s_dict, *s_depth, *s_coalesce, *s_api, *s_detail,
    *s_default_pg, *s_member, *s_idx, *s_name, *s_ranks, *s_active, *s_device_timer, *s_now_ns,
    *s_numel, *s_dtype, *s_get_device, *s_nbytes, *s_seq, *s_p2p_seq, *s_step, *s_stack,
    *s_op_ids, *s_cap, *s_rank, *s__step;
static PyObject *s_seq_slot, *s_seqs, *s_tseq, *s_tseqs, *s_get_tseq, *s_p2p_one;
static PyObject *i_zero, *i_one;   /* owned references to the ints 0 and 1 */
/* Calls recorded here / handed to the Python wrapper, and the line of the last hand-over
 * (tests and benchmarks read them through counts()). */
static unsigned long long n_slow;
static int last_slow_line;

/* This thread's state, in one thread-local block: the blocking path reads and writes most of
 * it per op, and each separate _Thread_local of a shared library is a call to __tls_get_addr
 * (the module's TLS block is found once per function through a pointer to this struct).
 * What a blocking op touches (ctx_vectorcall, and wait_vectorcall inside torch's call) is the
 * first 64 bytes, aligned: one memory line per op (issue 20, session 18; 80 bytes over two
 * lines from session 16's ov_api / ov_detail, which only DDP's issue uses: now in the second
 * line, flagged by `ov` in the first). */
typedef struct ThreadSt_s {
    /* -- the first line: every blocking op -- */
    PyObject *state;      /* this thread's wrappers.tls.__dict__ (one reference for good) */
    PyObject *st_d;       /* the state dict seen at depth 0, no coalescing, at tag st_v */
    uint64_t st_v;
    PyObject *api, *detail;   /* its api / detail overrides then (borrowed: the dict holds them) */
    /* The group of a blocking call being recorded, read at its wait() (borrowed: the call
     * holds it), and the torch seq read there (-1: not read); see tseq_read below. */
    PyObject *tseq_g;
    long long tseq_hi;
    char depth;           /* inside a call recorded by this path (0 or 1) */
    char blk_wait;        /* set by a blocking call this path records, for its own Work.wait */
    char ov;              /* ov_api / ov_detail are set, for the next call of a ctx */
    /* -- the second line: ddp_issue's api / detail for the one call of its all_reduce ctx it
     * makes (borrowed: ddp_issue holds them), taken by that call: the dict is written only if
     * the call goes to the Python wrapper (ov_slow), not twice per bucket -- */
    PyObject *ov_api __attribute__((aligned(64)));
    PyObject *ov_detail;
} __attribute__((aligned(64))) ThreadSt;
_Static_assert(offsetof(ThreadSt, ov_api) == 64, "ThreadSt: a blocking op's fields in one line");
static _Thread_local ThreadSt tl = {.tseq_hi = -1};

/* The globals a blocking op reads, in one aligned struct in the order it reads them: five
 * lines (seven, spread over the section, before session 19: issue 20). The GIL guards them.
 * e_*: the entry checks' last answers and the dict tags they were read under (HAVE_DVER,
 * above; borrowed values: each dict holds its value while its tag is unchanged); the thread
 * state block (tl) of the Python thread that last called a blocking op's wrapper
 * (thread_st), by its PyThreadState and that state's id (ids are never reused, addresses
 * are: a thread that ended is never matched again). c_*: the recorder's fixed fields, read
 * once per recorder (they are set in its __init__; cache_recorder). */
struct Rec_s;
static HOT_DATA struct {
    /* -- line 0: thread_st, the entry checks -- */
    PyThreadState *e_ts; uint64_t e_ts_id; struct ThreadSt_s *e_ts_T;
    /* recorder._recorder (strong), read from the recorder module's dict e_recmod_d, and NVTX
     * seen inactive in nvtx_ranges' dict e_nvtx_d: valid until the Python side says either
     * changed (entry_changed(): the only writers are recorder._set_recorder, its fork hook,
     * and nvtx_ranges.install / uninstall), not by the dicts' tags (two lines less per op) */
    PyObject *e_recmod_d, *e_rec, *e_nvtx_d;
    uint64_t e_rdict_v;                      /* c_rdict's tag when e_step was read */
    long long e_step;                        /* the step (device timer None) */
    /* -- line 1 -- */
    PyObject *c_rec;            /* strong: its address is not reused while cached */
    PyObject *c_rdict;          /* its __dict__: device_timer and step, read per call */
    /* The arrays of c_counters and c_tseqs (counters_sync) and the op ids' next value (c_op_c:
     * 1 when c_op_ids is an OpIds whose cell is c_op_next): a blocking op reads these, here,
     * not the three objects' lines (issue 20, session 19). */
    long long *c_seq_v; Py_ssize_t c_seq_n; long long c_op_next;
    char e_rec_ok, e_nvtx_ok, e_rd_ok, c_stack, c_now_ok, c_op_c;
    char pf_on;
    char ts_at_wait;   /* 0: a blocking call's torch seq read after the call (gapcheck.py) */
    PyTypeObject *t_type0;
    int (*mt_tensor_meta)(PyObject *, long long *, PyObject **, long long *);
    /* -- line 2 -- */
    unsigned long long pg_gen;   /* bumped when the Python side clears its cache */
    /* Blocking ops that hold e_rec borrowed (not its refcount line: issue 20, session 20),
     * and the recorders let go of meanwhile (a list, strong; rec_retire), else NULL. */
    Py_ssize_t n_busy;
    PyObject *retired;
    uint64_t inprog_used;        /* bit i: inprog[i] used */
    uint64_t inprog_taken;       /* bit i: inprog[i] taken by a final flush */
    struct Rec_s *buf;           /* completed calls, in order */
    Py_ssize_t buf_len;
    Py_ssize_t buf_lim;          /* min(buf_alloc, buf_max): buf_push grows or drops from it */
    /* -- line 3 -- */
    /* c_tseqs' array (lane) where c_tseqs is the pair of c_counters (one array: its bound is
     * c_seq_n), else NULL: then c_tseqs is read through counters_get / counters_set */
    long long *c_tseq_v;
    PyObject *ts_gap;            /* torchseq.on_gap(rec, name, last, lo, op_id, seq), NULL: off */
    PyTypeObject *ts_type;       /* strong: the type whose getter ts_fn is */
    int (*mt_pg_seq)(PyObject *, long long *);
    unsigned long long n_meta_s; /* torch seq reads the C++ reads answered */
    unsigned long long n_tseq_reads;   /* torch seq reads (tseq_reads(): tests) */
    unsigned long e_thread;      /* PyThread_get_thread_ident() of e_ts's thread */
    struct Rec_s *inprog0;       /* inprog's slot 0 (inprog_ref) */
    /* -- the rest: not per op -- */
    PyObject *c_tseqs;           /* its _tseqs (Counters): last torch seq per slot, or NULL */
    PyObject *t_types;           /* torch's exact tensor types (exact_tensor) */
    PyTypeObject *t_type1;
    int (*mt_tensor_nbytes)(PyObject *, long long *);
    Py_ssize_t buf_alloc, buf_max;
    PyObject *c_seq, *c_p2p_seq, *c_op_ids, *c_rank;
    PyObject *c_counters;        /* its _seqs (Counters), or NULL: the seq dict */
    /* c_rec's class has recorder.py's step and device_timer properties (rd_props), whose
     * setters call rd_changed(): e_step is then trusted until told (e_rd_ok 1), not by
     * c_rdict's tag (2), one memory line less per op (issue 20, session 20) */
    char c_rd_notify;
    unsigned long long rd_epoch;   /* bumped by rd_changed() / entry_changed() (ent_rd_refresh's race) */
} H __attribute__((aligned(64))) = {.pg_gen = 1, .pf_on = 1, .ts_at_wait = 1, .buf_max = 200000};
_Static_assert(offsetof(__typeof__(H), c_rec) == 64 && offsetof(__typeof__(H), pg_gen) == 128 &&
               offsetof(__typeof__(H), c_tseq_v) == 192 && offsetof(__typeof__(H), c_tseqs) == 256,
               "H: the lines a blocking op reads");

/* buf_lim after buf_alloc or buf_max changed. */
static inline void buf_lim_set(void) {
    H.buf_lim = H.buf_alloc < H.buf_max ? H.buf_alloc : H.buf_max;
}

static void ctx_clear_refs(FastCtx *c) {
    Py_CLEAR(c->dict); Py_CLEAR(c->last_key); Py_CLEAR(c->last_name); Py_CLEAR(c->last_info);
    Py_CLEAR(c->orig); Py_CLEAR(c->slow); Py_CLEAR(c->on_error); Py_CLEAR(c->recmod);
    Py_CLEAR(c->tls); Py_CLEAR(c->pg_cache); Py_CLEAR(c->world); Py_CLEAR(c->nvtx);
    Py_CLEAR(c->time_ns); Py_CLEAR(c->code_internal); Py_CLEAR(c->site_pairs);
    Py_CLEAR(c->site_of_frame); Py_CLEAR(c->dev_names); Py_CLEAR(c->fact);
    Py_CLEAR(c->recmod_d); Py_CLEAR(c->nvtx_d); Py_CLEAR(c->world_d);
    Py_CLEAR(c->g_n); Py_CLEAR(c->g_d); Py_CLEAR(c->x_n); Py_CLEAR(c->x_d); Py_CLEAR(c->y_n);
    Py_CLEAR(c->y_d); Py_CLEAR(c->a_n); Py_CLEAR(c->a_d); Py_CLEAR(c->r0_n); Py_CLEAR(c->r0_d);
    Py_CLEAR(c->r1_n); Py_CLEAR(c->r1_d); Py_CLEAR(c->as_work_type);
    Py_CLEAR(c->as_nofut_backend); Py_CLEAR(c->last_dev); Py_CLEAR(c->p2p_key);
    Py_CLEAR(c->kw_tup);
}

/* Every live context (borrowed: a context leaves in its dealloc), so that invalidate() can drop
 * the group each one holds as its last (a destroyed group must not be kept alive). */
static FastCtx **ctxs;
static Py_ssize_t n_ctxs, cap_ctxs;

static void ctx_register(FastCtx *c) {
    if (n_ctxs == cap_ctxs) {
        Py_ssize_t cap = cap_ctxs ? 2 * cap_ctxs : 64;
        FastCtx **p = PyMem_Realloc(ctxs, cap * sizeof(FastCtx *));
        if (p == NULL)
            return;   /* not registered: its last group is dropped at its next call instead */
        ctxs = p;
        cap_ctxs = cap;
    }
    ctxs[n_ctxs++] = c;
}

static void ctx_unregister(FastCtx *c) {
    for (Py_ssize_t i = 0; i < n_ctxs; i++)
        if (ctxs[i] == c) {
            ctxs[i] = ctxs[--n_ctxs];
            return;
        }
}

_Static_assert(offsetof(FastCtx, kw_tup) == 64 && offsetof(FastCtx, last_dtype) == 128 &&
               offsetof(FastCtx, raw) <= 192, "FastCtx: a blocking op's fields in three lines");

/* The statistics of the contexts that were freed (counts(), meta_reads()). */
static unsigned long long n_dead_fast, n_dead_meta_t;

static PyTypeObject FastCtxType;

/* A new context, its fields zero, at the start of a line (the type is not subclassable and
 * not collected by the GC: a plain PyObject_Malloc block, freed by ctx_dealloc). */
static FastCtx *ctx_new(void) {
    char *raw = (char *)PyObject_Malloc(sizeof(FastCtx) + 64);
    if (raw == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    FastCtx *c = (FastCtx *)(raw + ((64 - ((uintptr_t)raw & 63)) & 63));
    memset(c, 0, sizeof(FastCtx));
    c->raw = raw;
    PyObject_Init((PyObject *)c, &FastCtxType);
    return c;
}

static void ctx_dealloc(FastCtx *c) {
    n_dead_fast += c->n_fast;
    n_dead_meta_t += c->n_meta_t;
    ctx_unregister(c);
    ctx_clear_refs(c);
    PyObject_Free(c->raw);
}

static PyObject *ctx_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames);

static PyGetSetDef ctx_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

/* The type slots of an object called through vectorcall (T: its struct, with a `vectorcall`
 * member), and those of a wrapper (FastCtx, WaitW, AroundW: `vectorcall` then `dict`, the
 * attributes functools.update_wrapper and registry.patch set, reached through ctx_getset). */
#define VECTORCALL_SLOTS(T, dealloc)                                                        \
    .tp_basicsize = sizeof(T), .tp_dealloc = (destructor)(dealloc),                         \
    .tp_call = PyVectorcall_Call, .tp_vectorcall_offset = offsetof(T, vectorcall)
#define WRAPPER_SLOTS(T, dealloc)                                                           \
    VECTORCALL_SLOTS(T, dealloc), .tp_dictoffset = offsetof(T, dict),                       \
    .tp_getattro = PyObject_GenericGetAttr, .tp_setattro = PyObject_GenericSetAttr,        \
    .tp_getset = ctx_getset

/* A wrapper compares equal to (and hashes as) torch's function it wraps: code that looks the
 * function up by value finds it under either, as torch.compile's collective rewrite does
 * (`fn in (dist.all_reduce, ...)` with torch's function against the installed wrapper). */
static PyObject *ctx_richcompare(PyObject *self, PyObject *other, int op) {
    PyObject *orig = ((FastCtx *)self)->orig;
    if ((op == Py_EQ || op == Py_NE) && orig != NULL && other == orig)
        return PyBool_FromLong(op == Py_EQ);
    Py_RETURN_NOTIMPLEMENTED;
}

static Py_hash_t ctx_hash(PyObject *self) {
    PyObject *orig = ((FastCtx *)self)->orig;
    return orig != NULL ? PyObject_Hash(orig) : _Py_HashPointer(self);
}

/* The wrapper itself: called like torch's function (vectorcall, no argument packing). */
static PyTypeObject FastCtxType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._fastpath.Wrapper",
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    WRAPPER_SLOTS(FastCtx, ctx_dealloc),
    .tp_richcompare = ctx_richcompare,
    .tp_hash = ctx_hash,
    .tp_doc = "A torch.distributed function recorded by commtrace (see __wrapped__).",
};

/* Where `name` is in the keyword names kwn (slot's rule), or -1. */
static int kw_index(PyObject *kwn, PyObject *name) {
    if (name == Py_None)
        return -1;
    Py_ssize_t nk = PyTuple_GET_SIZE(kwn);
    for (Py_ssize_t j = 0; j < nk; j++)
        if (PyTuple_GET_ITEM(kwn, j) == name)
            return (int)j;
    for (Py_ssize_t j = 0; j < nk; j++) {
        PyObject *k = PyTuple_GET_ITEM(kwn, j);
        /* two interned strings are equal only when they are one object (make_ctx interns
         * the names; the compiler interns a call's keyword names): no compare, whose
         * code is cold at 2 ranks (issue 20, session 14) */
        if (PyUnicode_CheckExact(k) && PyUnicode_CHECK_INTERNED(k) &&
                PyUnicode_CheckExact(name) && PyUnicode_CHECK_INTERNED(name))
            continue;
        int eq = PyUnicode_Compare(k, name);
        if (eq == 0)
            return (int)j;
        if (eq == -1 && PyErr_Occurred())
            CLEAR_ERR();
    }
    return -1;
}

/* Slot value: args[i] if i < n else the keyword `name`, else its default. Borrowed. */
static PyObject *slot(PyObject *const *a, Py_ssize_t n, PyObject *kwn, Py_ssize_t i,
                      PyObject *name, PyObject *dflt) {
    if (i < n)
        return a[i];
    int j = kwn != NULL ? kw_index(kwn, name) : -1;
    return j >= 0 ? a[n + j] : dflt;
}

#define SL_G 0
#define SL_X 1
#define SL_Y 2
#define SL_A 3

/* A call with other keyword names than c's last: where its slots are. */
static COLD void kw_learn(FastCtx *c, PyObject *kwn) {
    PyObject *names[4] = {c->g_n, c->x_n, c->y_n, c->a_n};
    for (int k = 0; k < 4; k++) {
        int j = names[k] != NULL ? kw_index(kwn, names[k]) : -1;
        c->kw_j[k] = (signed char)(j < 127 ? j : -2);   /* -2: past the cache, slot() */
    }
    Py_INCREF(kwn);
    Py_XSETREF(c->kw_tup, kwn);
}

/* slot() for the slots g, x, y, a (SL_*), the keywords' places from c's cache. */
static inline PyObject *slot_k(FastCtx *c, PyObject *const *a, Py_ssize_t n, PyObject *kwn,
                               int k, Py_ssize_t i, PyObject *name, PyObject *dflt) {
    if (i < n)
        return a[i];
    if (kwn == NULL || name == Py_None)
        return dflt;
    if (UNLIKELY(kwn != c->kw_tup))
        kw_learn(c, kwn);
    int j = c->kw_j[k];
    if (UNLIKELY(j == -2))
        return slot(a, n, kwn, i, name, dflt);
    return j >= 0 ? a[n + j] : dflt;
}

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}



/* ---------------------------------------------------------------------------------------
 * Per-recorder collective seq counters, by slot (recorder.seq_slot(pg name)): one C array
 * shared by the C path and the Python paths (Recorder.next_seq). A Counters and its pair()
 * (the recorder's _seqs and _tseqs: the last torch seq claimed per slot) share one array,
 * slot i's two values side by side: a blocking op reads and writes both, one line (issue 20,
 * session 19).
 * ------------------------------------------------------------------------------------- */
typedef struct Counters_s {
    PyObject_HEAD
    long long *v;       /* the base's: 2 values per slot (lane 0: the base's, lane 1: its pair's) */
    Py_ssize_t n;       /* the base's: slots */
    struct Counters_s *base;   /* a pair(): its base (strong), else NULL */
} Counters;

#define CT_BASE(k) ((k)->base != NULL ? (k)->base : (k))
#define CT_LANE(k) ((k)->base != NULL ? 1 : 0)

static void counters_sync(PyObject *k);

/* &k's value of slot, the array grown to hold it; NULL when slot < 0 or out of memory. */
static long long *counters_at(Counters *k, Py_ssize_t slot) {
    if (slot < 0)
        return NULL;
    Counters *b = CT_BASE(k);
    if (slot >= b->n) {
        Py_ssize_t n = b->n ? b->n : 16;
        while (n <= slot)
            n *= 2;
        long long *nv = (long long *)PyMem_RawRealloc(b->v, (size_t)n * 2 * sizeof(long long));
        if (nv == NULL)
            return NULL;
        memset(nv + 2 * b->n, 0, (size_t)(n - b->n) * 2 * sizeof(long long));
        b->v = nv;
        b->n = n;
        counters_sync((PyObject *)b);
    }
    return &b->v[2 * slot + CT_LANE(k)];
}

static long long counters_next(Counters *k, Py_ssize_t slot) {
    long long *p = counters_at(k, slot);
    return p != NULL ? (*p)++ : -1;
}

static PyObject *counters_next_py(PyObject *self, PyObject *arg) {
    Py_ssize_t slot = PyLong_AsSsize_t(arg);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    long long v = counters_next((Counters *)self, slot);
    if (v < 0) {
        PyErr_SetString(PyExc_ValueError, "bad seq slot");
        return NULL;
    }
    return PyLong_FromLongLong(v);
}

static void counters_dealloc(Counters *k) {
    if (k->base != NULL)
        Py_DECREF(k->base);
    else
        PyMem_RawFree(k->v);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

/* The slot's value (0 when never set), and set it: the last torch seq recorded per group
 * (recorder._tseqs, see torchseq.py) uses these. */
static long long counters_get(Counters *k, Py_ssize_t slot) {
    Counters *b = CT_BASE(k);
    return slot >= 0 && slot < b->n ? b->v[2 * slot + CT_LANE(k)] : 0;
}

static void counters_set(Counters *k, Py_ssize_t slot, long long v) {
    long long *p = counters_at(k, slot);   /* grows the array to hold slot */
    if (p != NULL)
        *p = v;
}

static PyObject *counters_get_py(PyObject *self, PyObject *arg) {
    Py_ssize_t slot = PyLong_AsSsize_t(arg);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(counters_get((Counters *)self, slot));
}

static PyObject *counters_set_py(PyObject *self, PyObject *args) {
    Py_ssize_t slot;
    long long v;
    if (!PyArg_ParseTuple(args, "nL", &slot, &v))
        return NULL;
    if (slot < 0) {
        PyErr_SetString(PyExc_ValueError, "bad seq slot");
        return NULL;
    }
    counters_set((Counters *)self, slot, v);
    Py_RETURN_NONE;
}

static PyTypeObject CountersType;

/* pair() -> a Counters of its own values sharing this one's array (side by side per slot). */
static PyObject *counters_pair(PyObject *self, PyObject *unused) {
    Counters *k = (Counters *)self;
    if (k->base != NULL) {
        PyErr_SetString(PyExc_ValueError, "pair() of a pair");
        return NULL;
    }
    Counters *p = (Counters *)CountersType.tp_alloc(&CountersType, 0);
    if (p == NULL)
        return NULL;
    Py_INCREF(k);
    p->base = k;
    return (PyObject *)p;
}

static PyMethodDef counters_methods[] = {
    {"next", counters_next_py, METH_O, "next(slot) -> the slot's next value (0, 1, ...)."},
    {"pair", counters_pair, METH_NOARGS, "pair() -> another Counters sharing this one's array."},
    {"get", counters_get_py, METH_O, "get(slot) -> the slot's value (0 when never set)."},
    {"set", counters_set_py, METH_VARARGS, "set(slot, value)."},
    {NULL},
};

static PyTypeObject CountersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._fastpath.Counters",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)counters_dealloc,
    .tp_new = PyType_GenericNew,
    .tp_methods = counters_methods,
    .tp_doc = "Collective seq counters of one recorder, by slot.",
};


/* The recorder's op ids: an iterator like itertools.count(start) whose next value the C path
 * takes without making an int object. Both paths draw from it under the GIL. */
typedef struct {
    PyObject_HEAD
    long long next;
    long long *cell;   /* where the next value is: &next, or H.c_op_next while the C path's
                        * cached recorder's (cache_recorder): not this object's line per op */
} OpIds;

static PyObject *opids_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    long long start = 0;
    if (!PyArg_ParseTuple(args, "|L", &start))
        return NULL;
    OpIds *o = (OpIds *)tp->tp_alloc(tp, 0);
    if (o != NULL) {
        o->next = start;
        o->cell = &o->next;
    }
    return (PyObject *)o;
}

static PyObject *opids_iternext(PyObject *self) {
    return PyLong_FromLongLong((*((OpIds *)self)->cell)++);
}

static PyTypeObject OpIdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._fastpath.OpIds",
    .tp_basicsize = sizeof(OpIds),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = opids_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = opids_iternext,
    .tp_doc = "OpIds(start=0): start, start + 1, ... (the recorder's op ids).",
};

/* d[key] (0 when absent) as a new reference, and d[key] += 1; NULL on error. h is key's hash
 * where the caller keeps it (one hash per key, not one per lookup), or -1: not known (no
 * Python hash is -1, it is the error value). d is a dict. */
static PyObject *dict_next(PyObject *d, PyObject *key, Py_hash_t h) {
#if PY_VERSION_HEX >= 0x030D0000
    h = -1;   /* the known-hash calls are internal API from 3.13 on */
#endif
    PyObject *s = h == -1 ? PyDict_GetItemWithError(d, key)
                          : _PyDict_GetItem_KnownHash(d, key, h);
    if (s == NULL) {
        if (PyErr_Occurred())
            return NULL;
        s = PyLong_FromLong(0);
        if (s == NULL)
            return NULL;
    } else {
        Py_INCREF(s);
    }
    PyObject *s1 = PyNumber_Add(s, i_one);
    if (s1 == NULL || (h == -1 ? PyDict_SetItem(d, key, s1)
                               : _PyDict_SetItem_KnownHash(d, key, s1, h)) != 0) {
        Py_XDECREF(s1);
        Py_DECREF(s);
        return NULL;
    }
    Py_DECREF(s1);
    return s;
}

/* obj.name read from obj's own __dict__ when it is there (modules, plain instances: a dict
 * lookup, not the full attribute protocol), else through getattr. New reference or NULL. */
static PyObject *fast_attr(PyObject *d, PyObject *obj, PyObject *name) {
    if (d != NULL) {
        PyObject *v = PyDict_GetItemWithError(d, name);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
        CLEAR_ERR();
    }
    return PyObject_GetAttr(obj, name);
}

/* obj.__dict__ (new reference) or NULL. */
static PyObject *dict_of(PyObject *obj) {
    PyObject *d = PyObject_GenericGetDict(obj, NULL);
    if (d == NULL || !PyDict_Check(d)) {
        CLEAR_ERR();
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}


/* torch's TensorBase.numel / get_device (method descriptors) and dtype (getset descriptor),
 * called directly for tensors of the exact types given (torch.Tensor, nn.Parameter): no
 * method lookup. Other types (subclasses) go through the ordinary method calls. */
static PyObject *t_numel, *t_getdev, *t_dtype;
/* (H.t_types, H.t_type0, H.t_type1: in H, below: its first two are torch.Tensor, Parameter) */

/* What those three accessors touch first, prefetched when a call enters this path (issue 20).
 * At 2 ranks every op enters with cold caches (its previous wait slept while gloo's threads
 * and other processes ran), and the tensor's facts were the largest part of what the wrapper
 * adds: a knock-out build (2026-12-02 10:19-10:50 UTC, 2 ranks pinned, load 5-8) gave 1.8-2.5
 * us of thread CPU per op for numel + dtype + get_device, against 0.5-1.2 for any one of them.
 * Their code is torch's (cannot be kept warm from here) but its addresses are known: the
 * PyMethodDef / getset functions of the descriptors. Prefetched at entry, their misses overlap
 * the entry checks and the group lookup instead of stalling one after the other. Addresses
 * only: nothing of torch's is read or called here. Measured gain not settled: -0.68, -0.46
 * and +0.03 us per op in three paired runs, loaded machine (docs/performance.md). */
#define PF_MAX 16
static const void *pf_addr[PF_MAX];
static int pf_n;   /* (H.pf_on: in H) */

static void pf_add(const void *p, int lines) {
    for (int i = 0; p != NULL && i < lines && pf_n < PF_MAX; i++)
        pf_addr[pf_n++] = (const char *)p + 64 * i;
}

static void pf_setup(void) {
    pf_n = 0;
    PyObject *meth[2] = {t_numel, t_getdev};
    for (int i = 0; i < 2; i++) {
        if (meth[i] != NULL && Py_IS_TYPE(meth[i], &PyMethodDescr_Type)) {
            PyMethodDef *m = ((PyMethodDescrObject *)meth[i])->d_method;
            pf_add(meth[i], 1);
            pf_add(m, 1);
            pf_add((const void *)m->ml_meth, 2);
        }
    }
    if (t_dtype != NULL && Py_IS_TYPE(t_dtype, &PyGetSetDescr_Type)) {
        PyGetSetDef *g = ((PyGetSetDescrObject *)t_dtype)->d_getset;
        pf_add(t_dtype, 1);
        pf_add((const void *)g->get, 2);
    }
}

static NOINLINE void pf_accessors(void) {
    for (int i = 0; i < pf_n; i++)
        __builtin_prefetch(pf_addr[i]);
}

/* *flag = truth of arg; returns the previous value as a bool (the set_* switches). */
static PyObject *swap_flag(int *flag, PyObject *arg) {
    int old = *flag;
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    *flag = v;
    return PyBool_FromLong(old);
}

/* swap_flag for a flag kept in a byte. */
static PyObject *swap_flag_c(char *flag, PyObject *arg) {
    int f = *flag;
    PyObject *old = swap_flag(&f, arg);
    *flag = (char)f;
    return old;
}

/* set_prefetch(flag) -> the previous flag (benchmarks compare with it off). */
static PyObject *set_prefetch(PyObject *module, PyObject *arg) {
    return swap_flag_c(&H.pf_on, arg);
}

static PyObject *set_tensor_api(PyObject *module, PyObject *args) {
    PyObject *numel, *getdev, *dtype, *types;
    if (!PyArg_ParseTuple(args, "OOOO!", &numel, &getdev, &dtype, &PyTuple_Type, &types))
        return NULL;
    if (Py_TYPE(dtype)->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_TypeError, "dtype: a descriptor");
        return NULL;
    }
    Py_INCREF(numel); Py_XSETREF(t_numel, numel);
    Py_INCREF(getdev); Py_XSETREF(t_getdev, getdev);
    Py_INCREF(dtype); Py_XSETREF(t_dtype, dtype);
    Py_INCREF(types); Py_XSETREF(H.t_types, types);
    Py_ssize_t nt = PyTuple_GET_SIZE(types);
    H.t_type0 = nt > 0 ? (PyTypeObject *)PyTuple_GET_ITEM(types, 0) : NULL;
    H.t_type1 = nt > 1 ? (PyTypeObject *)PyTuple_GET_ITEM(types, 1) : NULL;
    pf_setup();
    Py_RETURN_NONE;
}

static inline int exact_tensor(PyObject *x) {
    PyTypeObject *tp0 = Py_TYPE(x);
    if (LIKELY(tp0 == H.t_type0))   /* NULL while t_types is */
        return 1;
    if (H.t_types == NULL)
        return 0;
    if (tp0 == H.t_type1)
        return 1;
    PyObject *tp = (PyObject *)tp0;
    Py_ssize_t n = PyTuple_GET_SIZE(H.t_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(H.t_types, i) == tp)
            return 1;
    return 0;
}

/* The tensor and group reads through torch's C++ API (issue 20): a capsule of function
 * pointers from the module `commtrace accel build` makes (_accel_meta.cpp, accel.py),
 * handed over by set_meta_api when that module is built for this torch and loads. Used in
 * place of the Python-level accessors above (numel, dtype, get_device, nbytes, and torch's
 * sequence-number getter): the same values, without the method calls, the int objects and
 * the getter's GIL release. Each returns 1 with the values, or 0 where it leaves the read to
 * the accessors (not a plain tensor read; see _accel_meta.cpp), never an error. */
typedef struct {
    int version;
    int (*tensor_meta)(PyObject *x, long long *numel, PyObject **dtype, long long *device);
    int (*tensor_nbytes)(PyObject *x, long long *nbytes);
    int (*pg_seq)(PyObject *g, long long *seq);
    /* version 2: an async op's completion stamped in C++ (see _accel_meta.cpp) */
    int (*work_attach)(PyObject *work, PyObject *row, long long (*now)(void));
    int (*work_done)(PyObject *work, int *done);
    int (*stamps_flush)(void (*stamp)(PyObject *row, long long t, int observed));
    const long long *stamps_queued;   /* a std::atomic<long long>: read with __atomic_load_n */
} MetaApi;
#define META_CAPSULE "commtrace.capture.accel.meta_api"
static const MetaApi *meta_api;
/* its functions, copied here (the capsule's struct is one more line to read per op) */
/* (H.mt_tensor_meta, H.mt_tensor_nbytes, H.mt_pg_seq: in H) */
/* the async path's (not a blocking op's: outside the hot section, which stays six lines) */
static int (*mt_work_attach)(PyObject *, PyObject *, long long (*)(void));
static int (*mt_work_done)(PyObject *, int *);
static int (*mt_stamps_flush)(void (*)(PyObject *, long long, int));
static const long long *mt_stamps_n;
static unsigned long long n_meta_attach;   /* completions attached in C++ (tests) */
static int cxx_completion = 1;   /* set_cxx_completion(): benchmarks compare (0: Python callback) */
static PyObject *meta_owner;   /* the capsule, kept (its module stays loaded) */
/* (FastCtx.n_meta_t, H.n_meta_s: reads it answered: tensors, seqs) */

static void stamps_flush_now(void);

/* meta_counts() -> (tensor reads, torch seq reads) answered through set_meta_api's capsule
 * (tests: the C++ reads were used, not only present). */
static PyObject *meta_counts(PyObject *module, PyObject *unused) {
    unsigned long long t = n_dead_meta_t;
    for (Py_ssize_t i = 0; i < n_ctxs; i++)
        t += ctxs[i]->n_meta_t;
    return Py_BuildValue("(KK)", t, H.n_meta_s);
}

/* set_meta_api(capsule or None) -> whether the reads are now through it. */
static PyObject *set_meta_api(PyObject *module, PyObject *cap) {
    if (cap == Py_None) {
        stamps_flush_now();
        meta_api = NULL;
        H.mt_tensor_meta = NULL;
        H.mt_tensor_nbytes = NULL;
        H.mt_pg_seq = NULL;
        mt_work_attach = NULL;
        mt_work_done = NULL;
        mt_stamps_flush = NULL;
        mt_stamps_n = NULL;
        Py_CLEAR(meta_owner);
        Py_RETURN_FALSE;
    }
    const MetaApi *m = PyCapsule_GetPointer(cap, META_CAPSULE);
    if (m == NULL)
        return NULL;
    if (m->version < 1 || m->version > 2 || m->tensor_meta == NULL ||
            m->tensor_nbytes == NULL || m->pg_seq == NULL ||
            (m->version >= 2 && (m->work_attach == NULL || m->work_done == NULL ||
                                 m->stamps_flush == NULL || m->stamps_queued == NULL))) {
        PyErr_SetString(PyExc_ValueError, "set_meta_api: another version of the capsule");
        return NULL;
    }
    Py_INCREF(cap);
    Py_XSETREF(meta_owner, cap);
    meta_api = m;
    H.mt_tensor_meta = m->tensor_meta;
    H.mt_tensor_nbytes = m->tensor_nbytes;
    H.mt_pg_seq = m->pg_seq;
    /* Queued stamps of the capsule being replaced are written first (they hold rows). */
    stamps_flush_now();
    mt_work_attach = m->version >= 2 ? m->work_attach : NULL;
    mt_work_done = m->version >= 2 ? m->work_done : NULL;
    mt_stamps_flush = m->version >= 2 ? m->stamps_flush : NULL;
    mt_stamps_n = m->version >= 2 ? m->stamps_queued : NULL;
    Py_RETURN_TRUE;
}

/* Global rank from (global arg, group-local arg) as wrappers._global. New reference or
 * Py_None (new ref); NULL on error. */
static PyObject *global_rank(PyObject *info, PyObject *glob, PyObject *grp) {
    if (glob != Py_None)
        return PyNumber_Index(glob);
    if (grp != Py_None) {
        PyObject *ranks = PyObject_GetAttr(info, s_ranks);
        if (ranks == NULL)
            return NULL;
        PyObject *r = PyObject_GetItem(ranks, grp);
        Py_DECREF(ranks);
        if (r == NULL) {
            CLEAR_ERR();
            Py_RETURN_NONE;
        }
        return r;
    }
    Py_RETURN_NONE;
}

/* Call sites seen before, by (code object, instruction offset) of the calling frame, when
 * that frame is user code (the site is then that frame's file:line). The code objects are
 * kept alive, so an address is never reused while cached. */
#define SITE_SLOTS 4096
#define SITE_PROBES 8
/* 32 bytes, the table aligned to a line: an entry never straddles two lines (24 bytes from
 * an offset of 32 did, one in four: the blocking op's lookup reads one) */
typedef struct { PyObject *code; PyObject *site; int lasti; } __attribute__((aligned(32))) SiteEnt;
static SiteEnt site_tab[SITE_SLOTS] __attribute__((aligned(64)));

static inline size_t site_hash(PyObject *code, int lasti) {
    return ((((size_t)code) >> 4) ^ ((size_t)(unsigned)lasti * 2654435761u)) & (SITE_SLOTS - 1);
}

/* The call site: (file, line) of the first user frame above the wrapper; new ref. */
#if PY_VERSION_HEX >= 0x030B0000
/* sites.site_of_frame(f) for a frame `f` whose code is internal, walking out from its caller:
 * frames whose code is known internal are skipped, the first known user frame's (file, line)
 * comes from sites._site_pairs. NULL (no error) when the walk meets a code object not
 * classified yet or a pair not cached: the caller asks site_of_frame, which fills the caches.
 * Py_None when no user frame is left. */
static PyObject *site_walk_in(PyObject *code_internal, PyObject *site_pairs,
                              PyFrameObject *f) {
    PyFrameObject *g = PyFrame_GetBack(f);   /* new ref */
    PyObject *res = NULL;
    while (g != NULL) {
        PyCodeObject *code = PyFrame_GetCode(g);
        PyObject *k = PyLong_FromVoidPtr(code);
        PyObject *internal = k != NULL ? PyDict_GetItemWithError(code_internal, k) : NULL;
        if (internal == Py_True) {
            PyFrameObject *up = PyFrame_GetBack(g);
            Py_DECREF(k);
            Py_DECREF(code);
            Py_DECREF(g);
            g = up;
            continue;
        }
        if (internal == Py_False) {
            PyObject *li = PyLong_FromLong(PyFrame_GetLasti(g));
            PyObject *key = li == NULL ? NULL : PyTuple_Pack(2, k, li);
            Py_XDECREF(li);
            if (key != NULL) {
                res = PyDict_GetItemWithError(site_pairs, key);
                Py_XINCREF(res);
                Py_DECREF(key);
            }
        }
        Py_XDECREF(k);
        Py_DECREF(code);
        Py_DECREF(g);
        CLEAR_ERR();
        return res;
    }
    Py_RETURN_NONE;
}

static PyObject *site_walk(FastCtx *c, PyFrameObject *f) {
    return site_walk_in(c->code_internal, c->site_pairs, f);
}
#endif

#if CT_IFRAME
/* Code objects classified internal (sites._code_internal[id(code)] is True), by address, kept
 * alive as site_tab's: a classification never changes once made (sites.py caches it for
 * good), so the walk below skips torch's frames without a dict lookup or a frame object. */
#define ICODE_SLOTS 1024
#define ICODE_PROBES 8
static PyObject *icode_tab[ICODE_SLOTS];

static inline size_t icode_hash(PyObject *code) {
    return (((size_t)code) >> 4) & (ICODE_SLOTS - 1);
}

static inline int icode_known(PyObject *code) {
    size_t h = icode_hash(code);
    for (int i = 0; i < ICODE_PROBES; i++) {
        PyObject *e = icode_tab[(h + i) & (ICODE_SLOTS - 1)];
        if (e == code)
            return 1;
        if (e == NULL)
            return 0;
    }
    return 0;
}

static void icode_add(PyObject *code) {
    size_t h = icode_hash(code);
    for (int i = 0; i < ICODE_PROBES; i++) {
        PyObject **e = &icode_tab[(h + i) & (ICODE_SLOTS - 1)];
        if (*e == NULL) {
            Py_INCREF(code);
            *e = code;
            return;
        }
    }
}

static inline SiteEnt *site_find(PyObject *code, int lasti) {
    size_t h = site_hash(code, lasti);
    for (int i = 0; i < SITE_PROBES; i++) {
        SiteEnt *e = &site_tab[(h + i) & (SITE_SLOTS - 1)];
        if (e->code == NULL)
            return NULL;
        if (e->code == code && e->lasti == lasti)
            return e;
    }
    return NULL;
}

static void site_add(PyObject *code, int lasti, PyObject *site) {
    size_t h = site_hash(code, lasti);
    for (int i = 0; i < SITE_PROBES; i++) {
        SiteEnt *e = &site_tab[(h + i) & (SITE_SLOTS - 1)];
        if (e->code == NULL) {
            e->code = code;
            Py_INCREF(code);
            e->lasti = lasti;
            e->site = site;
            Py_INCREF(site);
            return;
        }
    }
}

/* sites.site_of_frame's answer for the frame `fr` (the innermost one), read from the
 * interpreter frames (no frame objects, no int key per frame): frames whose code is known
 * internal are skipped, the first other frame's site comes from site_tab, or from sites.py's
 * caches (then kept in the C tables). NULL (no error) wherever that walk would not give the
 * Python walk's answer for sure -- an incomplete frame, a code object or a site not cached
 * yet, a full table, no user frame left -- and the caller walks as before. A new reference.
 * first_missed: the caller has looked `fr` itself up in site_tab and missed (call_site), so
 * its lookup is not made again. */
static PyObject *site_walk_frames(_PyInterpreterFrame *fr, PyObject *code_internal,
                                  PyObject *site_pairs, int first_missed) {
    for (; fr != NULL; fr = fr->previous, first_missed = 0) {
        if (_PyFrame_IsIncomplete(fr))
            return NULL;
        PyObject *code = (PyObject *)fr->f_code;
        if (icode_known(code))
            continue;
        int li = _PyInterpreterFrame_LASTI(fr);
        int lasti = li < 0 ? -1 : li * (int)sizeof(_Py_CODEUNIT);   /* PyFrame_GetLasti's */
        SiteEnt *e = first_missed ? NULL : site_find(code, lasti);
        if (e != NULL) {
            Py_INCREF(e->site);
            return e->site;
        }
        PyObject *k = PyLong_FromVoidPtr(code);
        PyObject *internal = k != NULL ? PyDict_GetItemWithError(code_internal, k) : NULL;
        PyObject *res = NULL;
        if (internal == Py_True) {
            Py_DECREF(k);
            icode_add(code);
            continue;
        }
        if (internal == Py_False) {
            PyObject *lio = PyLong_FromLong(lasti);
            PyObject *key = lio == NULL ? NULL : PyTuple_Pack(2, k, lio);
            Py_XDECREF(lio);
            if (key != NULL) {
                res = PyDict_GetItemWithError(site_pairs, key);
                Py_DECREF(key);
            }
            if (res != NULL && res != Py_None) {
                site_add(code, lasti, res);
                Py_INCREF(res);
            } else {
                res = NULL;
            }
        }
        Py_XDECREF(k);
        CLEAR_ERR();
        return res;
    }
    return NULL;
}
#endif

static PyObject *call_site_miss(FastCtx *c);

/* The call site, from the cache when this (code, offset) was seen before: borrowed from
 * site_tab (which never lets go of it) with *own = 0, else a new reference with *own = 1. */
static PyObject *call_site(FastCtx *c, int *own) {
    *own = 1;
#if CT_IFRAME
    /* The wrapper is a C callable: the current Python frame is the caller's, its site in
     * site_tab; called from torch's code (DDP's buckets inside backward(), FSDP2's
     * collectives), the walk out to the user's frame over the cached classifications. */
    _PyInterpreterFrame *fr = PyThreadState_GET()->cframe->current_frame;
    if (LIKELY(fr != NULL)) {
        /* The caller's own site first, inline: a user's call (the common case) then touches
         * neither icode_tab nor the walk's code (session 17: the blocking op's cold lines).
         * The same answer as the walk's: site_tab holds only codes not internal. */
        if (UNLIKELY(_PyFrame_IsIncomplete(fr)))
            return call_site_miss(c);   /* the walk would give up on it too */
        int li = _PyInterpreterFrame_LASTI(fr);
        SiteEnt *e = site_find((PyObject *)fr->f_code,
                               li < 0 ? -1 : li * (int)sizeof(_Py_CODEUNIT));
        if (LIKELY(e != NULL)) {
            *own = 0;
            return e->site;
        }
        /* missed: the walk, which does not look this frame up in site_tab again */
        PyObject *res = site_walk_frames(fr, c->code_internal, c->site_pairs, 1);
        if (res != NULL)
            return res;
    }
#endif
    return call_site_miss(c);
}

/* Not cached (or before 3.11's frame layout): the frame object, the caches of sites.py. */
static COLD PyObject *call_site_miss(FastCtx *c) {
#if PY_VERSION_HEX >= 0x030B0000
    PyFrameObject *f = PyEval_GetFrame();
    if (f == NULL)
        Py_RETURN_NONE;
    PyCodeObject *code = PyFrame_GetCode(f); /* new ref */
    int lasti = PyFrame_GetLasti(f);
    size_t h = site_hash((PyObject *)code, lasti);
    for (int i = 0; i < SITE_PROBES; i++) {
        SiteEnt *e = &site_tab[(h + i) & (SITE_SLOTS - 1)];
        if (e->code == NULL)
            break;
        if (e->code == (PyObject *)code && e->lasti == lasti) {
            Py_DECREF(code);
            Py_INCREF(e->site);
            return e->site;
        }
    }
    Py_INCREF(f);
    PyObject *k = PyLong_FromVoidPtr(code);
    PyObject *res = NULL;
    int user = 0;
    if (k != NULL) {
        PyObject *internal = PyDict_GetItemWithError(c->code_internal, k);
        if (internal == Py_False) {
            user = 1;
            PyObject *li = PyLong_FromLong(lasti);
            PyObject *key = li == NULL ? NULL : PyTuple_Pack(2, k, li);
            Py_XDECREF(li);
            if (key != NULL) {
                res = PyDict_GetItemWithError(c->site_pairs, key);
                Py_XINCREF(res);
                Py_DECREF(key);
            }
        }
    }
    if (res == NULL && k != NULL && !user && !PyErr_Occurred() &&
        PyDict_GetItemWithError(c->code_internal, k) == Py_True)
        /* Called from torch's or commtrace's code (DDP's comm hook inside backward(), FSDP2's
         * collectives): sites.site_of_frame's walk, in C, over frames whose code is known; the
         * first user frame's pair from the shared cache. Not cached here by the innermost
         * frame: the user frame above it varies. */
        res = site_walk(c, f);
    if (res == NULL) {
        if (PyErr_Occurred())
            CLEAR_ERR();
        res = PyObject_CallOneArg(c->site_of_frame, (PyObject *)f);
        if (res != NULL && k != NULL && !user)
            user = PyDict_GetItemWithError(c->code_internal, k) == Py_False;
    }
    if (res != NULL && res != Py_None && user) {
        for (int i = 0; i < SITE_PROBES; i++) {
            SiteEnt *e = &site_tab[(h + i) & (SITE_SLOTS - 1)];
            if (e->code == NULL) {
                e->code = (PyObject *)code;
                Py_INCREF(code);
                e->lasti = lasti;
                e->site = res;
                Py_INCREF(res);
                break;
            }
        }
    }
    CLEAR_ERR();
    Py_XDECREF(k);
    Py_DECREF(code);
    Py_DECREF(f);
    return res;
#else
    PyObject *sys_getframe = PySys_GetObject("_getframe");  /* borrowed */
    if (sys_getframe == NULL)
        Py_RETURN_NONE;
    PyObject *zero = PyLong_FromLong(0);
    PyObject *f = PyObject_CallOneArg(sys_getframe, zero);
    Py_DECREF(zero);
    if (f == NULL)
        return NULL;
    PyObject *res = PyObject_CallOneArg(c->site_of_frame, f);
    Py_DECREF(f);
    return res;
#endif
}


/* ---------------------------------------------------------------------------------------
 * Records of completed calls, kept in C until the writer thread drains them: no Python
 * object per op on the training thread (no allocation, nothing for the cyclic GC to visit).
 * ------------------------------------------------------------------------------------- */
#define NONE_LL LLONG_MIN
#define MAX_INPROG 64

typedef struct Rec_s {
    long long seq, peer, root, t0, t1, step, op_id, count, outb;
    unsigned long thread;
    int pgidx;
    short fact;
    /* REC_OWN_* bits: which of site, dtype and dev the record holds a reference to. The
     * others are borrowed from what keeps them alive for the life of the module: site_tab
     * (never emptied), the kept table (keep_obj). A cold op then does not write the refcount
     * lines of the three objects (issue 20, session 19). api and detail are always owned. */
    unsigned char own;
    PyObject *site, *api, *detail, *dtype, *dev;
} Rec;
#define REC_OWN_SITE 1
#define REC_OWN_DTYPE 2
#define REC_OWN_DEV 4

/* (H.buf: completed calls, in order; H.buf_len, H.buf_alloc, H.buf_max) */
static unsigned long long n_dropped;
/* Blocking calls in progress (_inflight.json, final flush): the record of each, where its
 * call made it, on the stack of ctx_vectorcall (live until the call returns and the slot is
 * freed; read and written under the GIL). Written once per op, not copied into a slot and
 * again into buf (issue 20, session 19: two memory lines less per cold op). */
static Rec *inprog[MAX_INPROG];   /* slot 0: H.inprog0, a line a blocking op reads anyway */

static inline Rec **inprog_ref(int i) {
    return i == 0 ? &H.inprog0 : &inprog[i];
}
_Static_assert(sizeof(Rec) == 128, "Rec: two lines");
/* (H.inprog_used, H.inprog_taken: bit i: inprog[i] used, taken) */

static inline void inprog_free(int i) {
    if (i >= 0) {
        H.inprog_used &= ~(1ULL << i);
        H.inprog_taken &= ~(1ULL << i);
    }
}

static long long as_ll(PyObject *o) {
    if (o == NULL || o == Py_None || !PyLong_Check(o))
        return NONE_LL;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        CLEAR_ERR();
        return NONE_LL;
    }
    return v;
}

static PyObject *ll_obj(long long v) {
    if (v == NONE_LL)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static void rec_release(Rec *r) {
    if (r->own & REC_OWN_SITE)
        Py_CLEAR(r->site);
    if (r->own & REC_OWN_DTYPE)
        Py_CLEAR(r->dtype);
    if (r->own & REC_OWN_DEV)
        Py_CLEAR(r->dev);
    r->site = r->dtype = r->dev = NULL;
    r->own = 0;
    Py_CLEAR(r->api); Py_CLEAR(r->detail);
}

static COLD int buf_grow(Rec *r) {
    if (H.buf_len >= H.buf_max) {
        n_dropped++;
        rec_release(r);
        return -1;
    }
    if (H.buf_len >= H.buf_alloc) {
        Py_ssize_t n = H.buf_alloc ? H.buf_alloc * 2 : 4096;
        if (n > H.buf_max)
            n = H.buf_max;
        /* aligned to a line: a record is then two lines, not three (buf_push writes one per
         * op on cold caches at 2 ranks); freed by free(), as drain_* do */
        Rec *nb = (Rec *)aligned_alloc(64, (size_t)n * sizeof(Rec));
        if (nb == NULL) {
            n_dropped++;
            rec_release(r);
            return -1;
        }
        if (H.buf_len > 0)
            memcpy(nb, H.buf, (size_t)H.buf_len * sizeof(Rec));
        free(H.buf);
        H.buf = nb;
        H.buf_alloc = n;
        buf_lim_set();
    }
    return 0;
}

static inline void buf_push(Rec *r) {
    if (UNLIKELY(H.buf_len >= H.buf_lim) && buf_grow(r) != 0)
        return;
    H.buf[H.buf_len++] = *r;
}

/* The values of r in recorder.F_* order, then t_return_ns (19, new references; NULL ones are
 * replaced by None). steal: r's object references move into v (r gives them up). */
static void rec_values(Rec *r, PyObject **v, int steal) {
    v[0] = PyLong_FromLong(r->fact);
    v[1] = PyLong_FromLong(r->pgidx);
    v[2] = ll_obj(r->seq);
    v[3] = ll_obj(r->peer);
    v[4] = ll_obj(r->root);
    v[5] = ll_obj(r->t0);
    v[6] = ll_obj(r->step);
    v[7] = r->site;
    v[8] = ll_obj(r->op_id);
    v[9] = PyLong_FromUnsignedLong(r->thread);
    v[10] = r->api;
    v[11] = r->detail;
    v[12] = ll_obj(r->count);
    v[13] = r->dtype;
    v[14] = r->dev;
    v[15] = Py_None; Py_INCREF(Py_None);
    v[16] = ll_obj(r->outb);
    v[17] = Py_False; Py_INCREF(Py_False);
    v[18] = ll_obj(r->t1);
    if (steal) {
        /* the owned references move into v; the borrowed ones are taken */
        if (!(r->own & REC_OWN_SITE))
            Py_XINCREF(v[7]);
        if (!(r->own & REC_OWN_DTYPE))
            Py_XINCREF(v[13]);
        if (!(r->own & REC_OWN_DEV))
            Py_XINCREF(v[14]);
        r->site = r->api = r->detail = r->dtype = r->dev = NULL;
        r->own = 0;
    } else {
        Py_XINCREF(v[7]); Py_XINCREF(v[10]); Py_XINCREF(v[11]); Py_XINCREF(v[13]);
        Py_XINCREF(v[14]);
    }
    for (int i = 0; i < 19; i++) {
        if (v[i] == NULL) {
            CLEAR_ERR();
            v[i] = Py_None;
            Py_INCREF(Py_None);
        }
    }
}

/* The short record (recorder.F_* order) of r; new reference, NULL on error. */
static PyObject *rec_pre(Rec *r) {
    PyObject *v[19];
    rec_values(r, v, 0);
    Py_DECREF(v[18]);   /* t_return_ns is not part of the record */
    PyObject *t = PyTuple_New(18);
    for (int i = 0; i < 18; i++) {
        if (t != NULL)
            PyTuple_SET_ITEM(t, i, v[i]);
        else
            Py_DECREF(v[i]);
    }
    return t;
}

/* drain_columns() -> None when empty, else 19 lists: the short-record fields (recorder.F_*
 * order) and t_return_ns, of the calls completed since the last drain. Column lists, so the
 * writer builds no Python object per row. */
static PyObject *drain_columns(PyObject *module, PyObject *unused) {
    Rec *b = H.buf;
    Py_ssize_t n = H.buf_len;
    if (n == 0)
        Py_RETURN_NONE;
    H.buf = NULL;
    H.buf_len = H.buf_alloc = H.buf_lim = 0;
    PyObject *cols[19];
    int ok = 1;
    for (int j = 0; j < 19; j++) {
        cols[j] = PyList_New(n);
        if (cols[j] == NULL)
            ok = 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Rec *r = &b[i];
        if (ok) {
            PyObject *v[19];
            rec_values(r, v, 1);   /* references move to the lists */
            for (int j = 0; j < 19; j++) {
                PyList_SET_ITEM(cols[j], i, v[j]);
            }
        }
        rec_release(r);
    }
    free(b);   /* buf_grow's aligned_alloc */
    if (!ok) {
        for (int j = 0; j < 19; j++)
            Py_XDECREF(cols[j]);
        n_dropped += (unsigned long long)n;
        CLEAR_ERR();
        Py_RETURN_NONE;
    }
    PyObject *out = PyTuple_New(19);
    if (out == NULL) {
        for (int j = 0; j < 19; j++)
            Py_DECREF(cols[j]);
        return NULL;
    }
    for (int j = 0; j < 19; j++)
        PyTuple_SET_ITEM(out, j, cols[j]);
    return out;
}

/* drain_records() -> None when empty, else (n, nums, codes, tables): the calls completed since
 * the last drain as typed column buffers, for the writer to turn into Arrow arrays without a
 * Python object per row (issue 20). nums: bytes of 10 int64 columns of n values each, one
 * after the other (seq, peer, root, t0, step, op_id, count, out_bytes, t_return, thread),
 * LLONG_MIN for null; codes: bytes of 7 int32 columns of n values each (fact, pg index, then
 * site, api, detail, dtype, device as indices into tables, -1 for None); tables: 5 lists, the
 * distinct objects of site, api, detail, dtype and device (by identity) in order of first
 * appearance. Same values as drain_columns(), which stays for bounded capture. */
#define DR_NUMS 10
#define DR_CODES 7
#define DR_OBJS 5

typedef struct { PyObject *key; int code; } DrEnt;

static int dr_code(PyObject *o, DrEnt **tab, Py_ssize_t *cap, PyObject *list) {
    if (o == NULL || o == Py_None)
        return -1;
    Py_ssize_t c = *cap;
    if (PyList_GET_SIZE(list) * 2 >= c) {   /* grow: rehash */
        Py_ssize_t nc = c ? c * 4 : 64;
        DrEnt *nt = (DrEnt *)PyMem_RawCalloc((size_t)nc, sizeof(DrEnt));
        if (nt == NULL)
            return -2;
        for (Py_ssize_t i = 0; i < c; i++) {
            if ((*tab)[i].key != NULL) {
                size_t h = ((size_t)(*tab)[i].key >> 4) & (size_t)(nc - 1);
                while (nt[h].key != NULL)
                    h = (h + 1) & (size_t)(nc - 1);
                nt[h] = (*tab)[i];
            }
        }
        PyMem_RawFree(*tab);
        *tab = nt;
        *cap = c = nc;
    }
    size_t h = ((size_t)o >> 4) & (size_t)(c - 1);
    while ((*tab)[h].key != NULL) {
        if ((*tab)[h].key == o)
            return (*tab)[h].code;
        h = (h + 1) & (size_t)(c - 1);
    }
    int code = (int)PyList_GET_SIZE(list);
    if (PyList_Append(list, o) != 0)
        return -2;
    (*tab)[h].key = o;
    (*tab)[h].code = code;
    return code;
}

static PyObject *drain_records(PyObject *module, PyObject *unused) {
    Rec *b = H.buf;
    Py_ssize_t n = H.buf_len;
    if (n == 0)
        Py_RETURN_NONE;
    H.buf = NULL;
    H.buf_len = H.buf_alloc = H.buf_lim = 0;
    PyObject *nums = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(long long) * DR_NUMS * n);
    PyObject *codes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int) * DR_CODES * n);
    PyObject *lists[DR_OBJS] = {NULL};
    DrEnt *tabs[DR_OBJS] = {NULL};
    Py_ssize_t caps[DR_OBJS] = {0};
    int ok = nums != NULL && codes != NULL;
    for (int j = 0; j < DR_OBJS && ok; j++) {
        lists[j] = PyList_New(0);
        if (lists[j] == NULL)
            ok = 0;
    }
    if (ok) {
        long long *v = (long long *)PyBytes_AS_STRING(nums);
        int *k = (int *)PyBytes_AS_STRING(codes);
        for (Py_ssize_t i = 0; i < n && ok; i++) {
            Rec *r = &b[i];
            v[0 * n + i] = r->seq;
            v[1 * n + i] = r->peer;
            v[2 * n + i] = r->root;
            v[3 * n + i] = r->t0;
            v[4 * n + i] = r->step;
            v[5 * n + i] = r->op_id;
            v[6 * n + i] = r->count;
            v[7 * n + i] = r->outb;
            v[8 * n + i] = r->t1;
            v[9 * n + i] = (long long)r->thread;
            k[0 * n + i] = r->fact;
            k[1 * n + i] = r->pgidx;
            PyObject *objs[DR_OBJS] = {r->site, r->api, r->detail, r->dtype, r->dev};
            for (int j = 0; j < DR_OBJS; j++) {
                int c = dr_code(objs[j], &tabs[j], &caps[j], lists[j]);
                if (c == -2) {
                    ok = 0;
                    break;
                }
                k[(2 + j) * n + i] = c;
            }
        }
    }
    /* the tables hold their own references now; the records give theirs up */
    for (Py_ssize_t i = 0; i < n; i++)
        rec_release(&b[i]);
    free(b);   /* buf_grow's aligned_alloc */
    for (int j = 0; j < DR_OBJS; j++)
        PyMem_RawFree(tabs[j]);
    PyObject *out = NULL;
    if (ok) {
        PyObject *tl = PyTuple_New(DR_OBJS);
        if (tl != NULL) {
            for (int j = 0; j < DR_OBJS; j++) {
                PyTuple_SET_ITEM(tl, j, lists[j]);
                lists[j] = NULL;
            }
            out = Py_BuildValue("(nNNN)", n, nums, codes, tl);
            nums = codes = NULL;
        }
    }
    for (int j = 0; j < DR_OBJS; j++)
        Py_XDECREF(lists[j]);
    Py_XDECREF(nums);
    Py_XDECREF(codes);
    if (out == NULL) {
        n_dropped += (unsigned long long)n;
        CLEAR_ERR();
        Py_RETURN_NONE;
    }
    return out;
}

/* pack_rows(rows, kinds) -> None or (n, nums, codes, tables, nulls): queued full rows (async ops of
 * either path, marks, gaps, ...: lists or tuples of len(kinds) values, schema order) as typed
 * column buffers, for the writer to build Arrow arrays over whole columns with no Python
 * object per row and field (issue 20). kinds: bytes, one letter per column: 'i' integer
 * column (nums: n int64 values, LLONG_MIN for None), 'b' bool column (codes: 0, 1, -1 for
 * None), 'o' any other column (codes: index into its table of distinct objects by identity,
 * -1 for None). nums holds the 'i' columns one after the other, codes the 'b' and 'o'
 * columns, each in column order; tables: one list per 'o' column, in column order; nulls:
 * the count of None per column (int64, every column).
 * None when a value does not fit its column's letter (a bool or non-int in an integer column,
 * an int beyond int64 or equal to LLONG_MIN, a non-bool in a bool column, a row of another
 * length): the writer then takes the list path for these rows. Reads the rows only; calls no
 * Python code, so the rows are read as of one moment. */
static PyObject *pack_rows(PyObject *module, PyObject *args) {
    PyObject *rows, *kinds;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &rows, &PyBytes_Type, &kinds))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), ncol = PyBytes_GET_SIZE(kinds);
    const char *kd = PyBytes_AS_STRING(kinds);
    Py_ssize_t n_i = 0, n_k = 0, n_o = 0;
    for (Py_ssize_t j = 0; j < ncol; j++) {
        if (kd[j] == 'i')
            n_i++;
        else if (kd[j] == 'b')
            n_k++;
        else if (kd[j] == 'o')
            n_k++, n_o++;
        else {
            PyErr_SetString(PyExc_ValueError, "pack_rows: kinds are 'i', 'b' or 'o'");
            return NULL;
        }
    }
    if (n == 0)
        Py_RETURN_NONE;
    PyObject *nums = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(long long) * n_i * n);
    PyObject *codes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int) * n_k * n);
    PyObject *tl = PyTuple_New(n_o);
    DrEnt **tabs = (DrEnt **)PyMem_RawCalloc((size_t)(n_o ? n_o : 1), sizeof(DrEnt *));
    Py_ssize_t *caps = (Py_ssize_t *)PyMem_RawCalloc((size_t)(n_o ? n_o : 1), sizeof(Py_ssize_t));
    PyObject *nulls = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(long long) * ncol);
    int ok = nums != NULL && codes != NULL && tl != NULL && tabs != NULL && caps != NULL &&
             nulls != NULL;
    if (nulls != NULL)
        memset(PyBytes_AS_STRING(nulls), 0, sizeof(long long) * (size_t)ncol);
    for (Py_ssize_t j = 0; j < n_o && ok; j++) {
        PyObject *l = PyList_New(0);
        if (l == NULL)
            ok = 0;
        else
            PyTuple_SET_ITEM(tl, j, l);
    }
    int fits = 1;
    if (ok) {
        long long *v = (long long *)PyBytes_AS_STRING(nums);
        int *k = (int *)PyBytes_AS_STRING(codes);
        long long *nn = (long long *)PyBytes_AS_STRING(nulls);
        for (Py_ssize_t i = 0; i < n && ok && fits; i++) {
            PyObject *row = PyList_GET_ITEM(rows, i);
            PyObject **it;
            if (PyList_CheckExact(row) && PyList_GET_SIZE(row) == ncol)
                it = ((PyListObject *)row)->ob_item;
            else if (PyTuple_CheckExact(row) && PyTuple_GET_SIZE(row) == ncol)
                it = ((PyTupleObject *)row)->ob_item;
            else {
                fits = 0;
                break;
            }
            Py_ssize_t a = 0, c = 0, o = 0;
            for (Py_ssize_t j = 0; j < ncol; j++) {
                PyObject *x = it[j];
                nn[j] += x == Py_None;
                if (kd[j] == 'i') {
                    long long y = NONE_LL;
                    if (x != Py_None) {
                        if (!PyLong_CheckExact(x)) {
                            fits = 0;
                            break;
                        }
                        int of = 0;
                        y = PyLong_AsLongLongAndOverflow(x, &of);
                        if (of != 0 || y == NONE_LL || (y == -1 && PyErr_Occurred())) {
                            CLEAR_ERR();
                            fits = 0;
                            break;
                        }
                    }
                    v[a++ * n + i] = y;
                } else if (kd[j] == 'b') {
                    if (x == Py_None)
                        k[c++ * n + i] = -1;
                    else if (x == Py_True || x == Py_False)
                        k[c++ * n + i] = x == Py_True;
                    else {
                        fits = 0;
                        break;
                    }
                } else {
                    int code = dr_code(x, &tabs[o], &caps[o], PyTuple_GET_ITEM(tl, o));
                    if (code == -2) {
                        ok = 0;
                        break;
                    }
                    k[c++ * n + i] = code;
                    o++;
                }
            }
        }
    }
    for (Py_ssize_t j = 0; tabs != NULL && j < n_o; j++)
        PyMem_RawFree(tabs[j]);
    PyMem_RawFree(tabs);
    PyMem_RawFree(caps);
    PyObject *out = NULL;
    if (ok && fits) {
        out = Py_BuildValue("(nNNNN)", n, nums, codes, tl, nulls);
        nums = codes = tl = nulls = NULL;
    }
    Py_XDECREF(nulls);
    Py_XDECREF(nums);
    Py_XDECREF(codes);
    Py_XDECREF(tl);
    if (out == NULL) {
        CLEAR_ERR();
        Py_RETURN_NONE;
    }
    return out;
}

/* Arrow buffers of one column, built in C from the writer's typed buffers (issue 20): the
 * writer's numpy route paid 10-30 numpy calls per column, a fixed cost per column and part
 * that dominated parts of a few hundred rows (a DDP rank writes ~1,000 rows per 2 s part).
 * Validity bitmaps are Arrow's: least significant bit first, a 1 for a value. */

static PyObject *bitmap_or_none(const unsigned char *ok, Py_ssize_t n, Py_ssize_t nnull) {
    if (nnull == 0)
        Py_RETURN_NONE;
    PyObject *bm = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (bm == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(bm);
    memset(p, 0, (size_t)((n + 7) / 8));
    for (Py_ssize_t i = 0; i < n; i++)
        if (ok[i])
            p[i >> 3] |= (unsigned char)(1u << (i & 7));
    return bm;
}

/* A column's flags (1: a value, 0: null), n of them; NULL with MemoryError set. */
static unsigned char *flags_new(Py_ssize_t n) {
    unsigned char *ok = (unsigned char *)PyMem_RawMalloc((size_t)(n ? n : 1));
    if (ok == NULL)
        PyErr_NoMemory();
    return ok;
}

/* The column builders' common end: (validity or None, nnull, a) or, b not NULL, (validity or
 * None, nnull, a, b), the validity bitmap built from ok[0..n). Takes the references to a and
 * b whatever happens (Py_BuildValue's "N"); NULL on error. */
static PyObject *column_result(const unsigned char *ok, Py_ssize_t n, Py_ssize_t nnull,
                               PyObject *a, PyObject *b) {
    PyObject *bm = bitmap_or_none(ok, n, nnull);
    if (bm == NULL) {
        Py_DECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    return b == NULL ? Py_BuildValue("(NnN)", bm, nnull, a)
                     : Py_BuildValue("(NnNN)", bm, nnull, a, b);
}

/* Whether column j (n values of `size` bytes each) lies in `b`; ValueError "NAME: bad column"
 * if not (NAME: the builder's). */
static int column_in(const char *name, const Py_buffer *b, Py_ssize_t j, Py_ssize_t n,
                     Py_ssize_t size) {
    if (n >= 0 && j >= 0 && (j + 1) * n * size <= b->len)
        return 1;
    PyErr_Format(PyExc_ValueError, "%s: bad column", name);
    return 0;
}

/* The column builders' exit: drops a and c (NULL or a reference), frees the flags, releases
 * the argument's buffer; returns out. */
static PyObject *column_done(PyObject *out, unsigned char *ok, Py_buffer *b, PyObject *a,
                             PyObject *c) {
    Py_XDECREF(a);
    Py_XDECREF(c);
    PyMem_RawFree(ok);
    PyBuffer_Release(b);
    return out;
}

/* int_column(buf, j, n, width) -> None or (validity or None, nnull, data): column j of `buf`
 * (int64 values, n per column, LLONG_MIN for null) as Arrow data of `width` bytes per value
 * (8: int64, 4: int32; nulls written as 0). None when a value does not fit int32 (width 4):
 * the caller's general route decides. */
static PyObject *int_column(PyObject *module, PyObject *args) {
    Py_buffer b;
    Py_ssize_t j, n;
    int width;
    if (!PyArg_ParseTuple(args, "y*nni", &b, &j, &n, &width))
        return NULL;
    PyObject *out = NULL, *data = NULL;
    unsigned char *ok = NULL;
    if (width != 4 && width != 8) {
        PyErr_SetString(PyExc_ValueError, "int_column: bad column");
        goto done;
    }
    if (!column_in("int_column", &b, j, n, (Py_ssize_t)sizeof(long long)))
        goto done;
    const long long *v = (const long long *)b.buf + j * n;
    data = PyBytes_FromStringAndSize(NULL, n * width);
    ok = flags_new(n);
    if (data == NULL || ok == NULL)
        goto done;
    Py_ssize_t nnull = 0;
    if (width == 8) {
        long long *d = (long long *)PyBytes_AS_STRING(data);
        for (Py_ssize_t i = 0; i < n; i++) {
            long long y = v[i];
            ok[i] = y != NONE_LL;
            nnull += y == NONE_LL;
            d[i] = y == NONE_LL ? 0 : y;
        }
    } else {
        int *d = (int *)PyBytes_AS_STRING(data);
        for (Py_ssize_t i = 0; i < n; i++) {
            long long y = v[i];
            if (y == NONE_LL) {
                ok[i] = 0;
                nnull++;
                d[i] = 0;
            } else if (y < INT_MIN || y > INT_MAX) {
                Py_CLEAR(data);
                out = Py_None;
                Py_INCREF(out);
                goto done;
            } else {
                ok[i] = 1;
                d[i] = (int)y;
            }
        }
    }
    return column_done(column_result(ok, n, nnull, data, NULL), ok, &b, NULL, NULL);
done:
    return column_done(out, ok, &b, data, NULL);
}

/* bool_column(codes, j, n) -> (validity or None, nnull, values): column j of `codes` (int32, n
 * per column: 1 true, 0 false, -1 null) as an Arrow bool column's bitmaps. */
static PyObject *bool_column(PyObject *module, PyObject *args) {
    Py_buffer b;
    Py_ssize_t j, n;
    if (!PyArg_ParseTuple(args, "y*nn", &b, &j, &n))
        return NULL;
    PyObject *out = NULL, *vals = NULL;
    unsigned char *ok = NULL;
    if (!column_in("bool_column", &b, j, n, (Py_ssize_t)sizeof(int)))
        goto done;
    const int *k = (const int *)b.buf + j * n;
    vals = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    ok = flags_new(n);
    if (vals == NULL || ok == NULL)
        goto done;
    unsigned char *v = (unsigned char *)PyBytes_AS_STRING(vals);
    memset(v, 0, (size_t)((n + 7) / 8));
    Py_ssize_t nnull = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        ok[i] = k[i] >= 0;
        nnull += k[i] < 0;
        if (k[i] == 1)
            v[i >> 3] |= (unsigned char)(1u << (i & 7));
    }
    return column_done(column_result(ok, n, nnull, vals, NULL), ok, &b, NULL, NULL);
done:
    return column_done(out, ok, &b, vals, NULL);
}

/* string_column(codes, j, n, values) -> None or (validity or None, nnull, offsets, data):
 * column j of `codes` (int32, n per column: an index into `values`, -1 for null) as an Arrow
 * string column: int32 offsets and the values' bytes gathered. `values`: a list of bytes or
 * None (null). None when the data would pass 2**31 - 1 bytes (Arrow's string offsets). */
static PyObject *string_column(PyObject *module, PyObject *args) {
    Py_buffer b;
    Py_ssize_t j, n;
    PyObject *values;
    if (!PyArg_ParseTuple(args, "y*nnO!", &b, &j, &n, &PyList_Type, &values))
        return NULL;
    PyObject *out = NULL, *offs = NULL, *data = NULL;
    unsigned char *ok = NULL;
    Py_ssize_t nv = PyList_GET_SIZE(values);
    if (!column_in("string_column", &b, j, n, (Py_ssize_t)sizeof(int)))
        goto done;
    for (Py_ssize_t t = 0; t < nv; t++) {
        PyObject *x = PyList_GET_ITEM(values, t);
        if (x != Py_None && !PyBytes_CheckExact(x)) {
            PyErr_SetString(PyExc_TypeError, "string_column: values are bytes or None");
            goto done;
        }
    }
    const int *k = (const int *)b.buf + j * n;
    offs = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int));
    ok = flags_new(n);
    if (offs == NULL || ok == NULL)
        goto done;
    int *o = (int *)PyBytes_AS_STRING(offs);
    long long total = 0;
    Py_ssize_t nnull = 0;
    o[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int c = k[i];
        PyObject *x = (c >= 0 && c < nv) ? PyList_GET_ITEM(values, c) : Py_None;
        if (x == Py_None) {
            ok[i] = 0;
            nnull++;
        } else {
            ok[i] = 1;
            total += PyBytes_GET_SIZE(x);
            if (total > INT_MAX) {
                out = Py_None;
                Py_INCREF(out);
                goto done;
            }
        }
        o[i + 1] = (int)total;
    }
    data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (data == NULL)
        goto done;
    char *d = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!ok[i])
            continue;
        PyObject *x = PyList_GET_ITEM(values, k[i]);
        Py_ssize_t len = PyBytes_GET_SIZE(x);
        memcpy(d + o[i], PyBytes_AS_STRING(x), (size_t)len);
    }
    return column_done(column_result(ok, n, nnull, offs, data), ok, &b, NULL, NULL);
done:
    return column_done(out, ok, &b, offs, data);
}

/* records_batch(n, nums, codes, rank, program, pgs, specs, dtypes, strs, consts) -> None or a
 * PyCapsule "arrow_array": the blocking calls drained by drain_records() as one Arrow record
 * batch (a struct array, Arrow's C data interface), every column's buffers built here in one
 * call (issue 20, session 22). The writer imported ~26 arrays one by one before (numpy, then
 * int_column / string_column, py_buffer and from_buffers per column): ~1 ms of a 4,000-row
 * soak part's ~6.5 ms of writer CPU, with the GIL held; the values are the same
 * (recorder.arrays_of_records, which the tests compare against the list path).
 *
 * program: bytes, one per column of the schema: an RB_* id (the column computed from the
 * records) or RB_NULL_* (a column the records do not fill, null throughout, of that type).
 * pgs: per pg index (name bytes or None, size int or None, backend bytes or None); specs: per
 * fact (op bytes or None, api bytes or None, in place: bool); dtypes: per dtype code (name
 * bytes or None, itemsize: int, -1 if none); strs: the site, api, detail and device tables
 * as lists of bytes or None (an api None or empty: the spec's); consts: (kind bytes,
 * completion bytes). None when an int32 column's value does not fit (the caller's general
 * route decides). The capsule follows the Arrow PyCapsule interface: pyarrow's
 * RecordBatch._import_from_c_capsule(schema capsule, it) moves the batch out. */
enum {
    RB_KIND = 1, RB_RANK, RB_PG, RB_PG_SIZE, RB_SEQ, RB_OP, RB_API, RB_ASYNC, RB_BACKEND,
    RB_DEVICE, RB_DTYPE, RB_COUNT, RB_BYTES, RB_OUT_BYTES, RB_PEER, RB_ROOT, RB_T0,
    RB_T_RETURN, RB_T_END, RB_STEP, RB_SITE, RB_OP_ID, RB_FIRST, RB_THREAD, RB_DETAIL,
    RB_COMPLETION, RB_LAST_ID,
    RB_NULL_I64 = 100, RB_NULL_I32, RB_NULL_BOOL, RB_NULL_STR, RB_NULL_LIST64
};
#define RB_MAX_COLS 64

struct ArrowArray {   /* Arrow's C data interface (ABI-stable) */
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

typedef struct {
    void *mem[RB_MAX_COLS * 4 + 8];   /* every buffer allocated, freed at release */
    int n_mem;
    struct ArrowArray cols[RB_MAX_COLS];
    struct ArrowArray *col_ptrs[RB_MAX_COLS];
    const void *bufs[RB_MAX_COLS][3];
    struct ArrowArray list_child;      /* the (empty) values of all-null list columns */
    struct ArrowArray *list_child_ptr;
    const void *list_child_bufs[2];
    const void *root_bufs[1];
} RbPriv;

static void rb_child_release(struct ArrowArray *a) {
    a->release = NULL;   /* owned by the batch: freed with it */
}

static void rb_release(struct ArrowArray *a) {
    if (a->release == NULL)
        return;
    RbPriv *p = (RbPriv *)a->private_data;
    for (int i = 0; i < p->n_mem; i++)
        free(p->mem[i]);
    for (int64_t j = 0; j < a->n_children; j++)
        p->cols[j].release = NULL;
    free(p);
    a->release = NULL;
}

static void rb_capsule_free(PyObject *cap) {
    struct ArrowArray *a = (struct ArrowArray *)PyCapsule_GetPointer(cap, "arrow_array");
    if (a == NULL) {
        PyErr_Clear();
        return;
    }
    if (a->release != NULL)
        a->release(a);
    free(a);
}

/* size bytes, 64-aligned (Arrow's recommendation), zeroed when `zero`; kept in p */
static void *rb_alloc(RbPriv *p, size_t size, int zero) {
    if (p->n_mem >= (int)(sizeof(p->mem) / sizeof(p->mem[0])))
        return NULL;
    size = (size + 63) & ~(size_t)63;
    void *m = aligned_alloc(64, size ? size : 64);
    if (m == NULL)
        return NULL;
    if (zero)
        memset(m, 0, size ? size : 64);
    p->mem[p->n_mem++] = m;
    return m;
}

typedef struct { const char *s; Py_ssize_t len; } RbStr;   /* s NULL: null */

/* a table of bytes or None as RbStr[]; -1 with TypeError on another value */
static int rb_strs(PyObject *list, RbStr *out, Py_ssize_t nt) {
    for (Py_ssize_t t = 0; t < nt; t++) {
        PyObject *x = PyList_GET_ITEM(list, t);
        if (x == Py_None) {
            out[t].s = NULL;
            out[t].len = 0;
        } else if (PyBytes_CheckExact(x)) {
            out[t].s = PyBytes_AS_STRING(x);
            out[t].len = PyBytes_GET_SIZE(x);
        } else {
            PyErr_SetString(PyExc_TypeError, "records_batch: table values are bytes or None");
            return -1;
        }
    }
    return 0;
}

/* an int or None as long long (None: NONE_LL); -1 with an error set on another value */
static int rb_ll(PyObject *x, long long *out) {
    if (x == Py_None) {
        *out = NONE_LL;
        return 0;
    }
    if (!PyLong_Check(x)) {
        PyErr_SetString(PyExc_TypeError, "records_batch: table values are int or None");
        return -1;
    }
    *out = PyLong_AsLongLong(x);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static void rb_set(struct ArrowArray *c, int64_t n, int64_t nnull, int nbuf) {
    c->length = n;
    c->null_count = nnull;
    c->offset = 0;
    c->n_buffers = nbuf;
    c->n_children = 0;
    c->children = NULL;
    c->dictionary = NULL;
    c->release = rb_child_release;
    c->private_data = NULL;
}

/* an integer column (width 8 or 4) of v[0..n) (NONE_LL: null); 1 on success, 0 when a value
 * does not fit int32, -1 on no memory. The validity bitmap is written a byte (8 rows) at a
 * time: the loop over a part's rows is most of the batch's cost. */
static int rb_int(RbPriv *p, int j, const long long *v, Py_ssize_t n, int width) {
    unsigned char *bm = (unsigned char *)rb_alloc(p, (size_t)(n + 7) / 8, 0);
    void *d = rb_alloc(p, (size_t)n * (size_t)width, 0);
    if (bm == NULL || d == NULL)
        return -1;
    Py_ssize_t nnull = 0;
    for (Py_ssize_t i0 = 0; i0 < n; i0 += 8) {
        Py_ssize_t m = n - i0 < 8 ? n - i0 : 8;
        unsigned byte = 0;
        int bad = 0, nn = 0;
        if (width == 8) {
            long long *o = (long long *)d + i0;
            for (Py_ssize_t k = 0; k < m; k++) {
                long long y = v[i0 + k];
                unsigned ok = y != NONE_LL;
                nn += !ok;
                byte |= ok << k;
                o[k] = ok ? y : 0;
            }
        } else {
            int *o = (int *)d + i0;
            for (Py_ssize_t k = 0; k < m; k++) {
                long long y = v[i0 + k];
                unsigned ok = y != NONE_LL;
                bad |= ok & (y < INT_MIN || y > INT_MAX);
                nn += !ok;
                byte |= ok << k;
                o[k] = ok ? (int)y : 0;
            }
        }
        if (bad)
            return 0;
        bm[i0 >> 3] = (unsigned char)byte;
        nnull += nn;
    }
    rb_set(&p->cols[j], n, nnull, 2);
    p->bufs[j][0] = nnull ? bm : NULL;
    p->bufs[j][1] = d;
    return 1;
}

/* a string column: row i is tab[code[i]] (code < 0, >= nt, or a null entry: null). One code
 * on every row (most of a part's labels: kind, pg, op, dtype, device, the site of a loop) is
 * written as n copies of one value, by doubling. */
static int rb_str(RbPriv *p, int j, const int *code, const RbStr *tab, Py_ssize_t nt,
                  Py_ssize_t n) {
    int c0 = n ? code[0] : -1, same = 1;
    for (Py_ssize_t i = 0; i < n; i++)
        same &= code[i] == c0;
    int *o = (int *)rb_alloc(p, (size_t)(n + 1) * sizeof(int), 0);
    if (o == NULL)
        return -1;
    if (same && c0 >= 0 && c0 < nt && tab[c0].s != NULL) {
        long long len = tab[c0].len;
        if (len * (long long)n > INT_MAX)
            return 0;
        char *d = (char *)rb_alloc(p, (size_t)(len * n), 0);
        if (d == NULL)
            return -1;
        for (Py_ssize_t i = 0; i <= n; i++)
            o[i] = (int)(i * len);
        size_t have = 0, want = (size_t)(len * n);
        if (want) {
            memcpy(d, tab[c0].s, (size_t)len);
            have = (size_t)len;
            while (have < want) {
                size_t m = have < want - have ? have : want - have;
                memcpy(d + have, d, m);
                have += m;
            }
        }
        rb_set(&p->cols[j], n, 0, 3);
        p->bufs[j][0] = NULL;
        p->bufs[j][1] = o;
        p->bufs[j][2] = d;
        return 1;
    }
    unsigned char *bm = (unsigned char *)rb_alloc(p, (size_t)(n + 7) / 8, 1);
    if (bm == NULL)
        return -1;
    long long total = 0;
    Py_ssize_t nnull = 0;
    o[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int c = code[i];
        if (c >= 0 && c < nt && tab[c].s != NULL) {
            bm[i >> 3] |= (unsigned char)(1u << (i & 7));
            total += tab[c].len;
            if (total > INT_MAX)
                return 0;
        } else {
            nnull++;
        }
        o[i + 1] = (int)total;
    }
    char *d = (char *)rb_alloc(p, (size_t)total, 0);
    if (d == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int c = code[i];
        if (o[i + 1] != o[i])
            memcpy(d + o[i], tab[c].s, (size_t)tab[c].len);
    }
    rb_set(&p->cols[j], n, nnull, 3);
    p->bufs[j][0] = nnull ? bm : NULL;
    p->bufs[j][1] = o;
    p->bufs[j][2] = d;
    return 1;
}

/* a bool column: value v[i] (0/1), valid ok[i] (NULL: all valid) */
static int rb_bool(RbPriv *p, int j, const unsigned char *v, const unsigned char *ok,
                   Py_ssize_t n) {
    unsigned char *bm = (unsigned char *)rb_alloc(p, (size_t)(n + 7) / 8, 1);
    unsigned char *d = (unsigned char *)rb_alloc(p, (size_t)(n + 7) / 8, 1);
    if (bm == NULL || d == NULL)
        return -1;
    Py_ssize_t nnull = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int valid = ok == NULL || ok[i];
        nnull += !valid;
        bm[i >> 3] |= (unsigned char)(valid << (i & 7));
        d[i >> 3] |= (unsigned char)((valid && v[i]) << (i & 7));
    }
    rb_set(&p->cols[j], n, nnull, 2);
    p->bufs[j][0] = nnull ? bm : NULL;
    p->bufs[j][1] = d;
    return 1;
}

/* a column null throughout: its buffers point into `zeros` (a zeroed block of at least
 * (n + 1) * 8 bytes), as pa.nulls builds them */
static void rb_null(RbPriv *p, int j, int id, const void *zeros, Py_ssize_t n) {
    int nbuf = id == RB_NULL_STR ? 3 : 2;
    rb_set(&p->cols[j], n, n, nbuf);
    p->bufs[j][0] = zeros;
    p->bufs[j][1] = zeros;
    p->bufs[j][2] = zeros;
    if (id == RB_NULL_LIST64) {
        struct ArrowArray *c = &p->list_child;
        rb_set(c, 0, 0, 2);
        p->list_child_bufs[0] = NULL;
        p->list_child_bufs[1] = zeros;
        c->buffers = p->list_child_bufs;
        p->list_child_ptr = c;
        p->cols[j].n_children = 1;
        p->cols[j].children = &p->list_child_ptr;
    }
}

static PyObject *records_batch(PyObject *module, PyObject *args) {
    Py_ssize_t n;
    Py_buffer bn, bc, bp;
    long long rank;
    PyObject *pgs, *specs, *dtypes, *strs, *consts;
    if (!PyArg_ParseTuple(args, "ny*y*Ly*O!O!O!O!O!", &n, &bn, &bc, &rank, &bp,
                          &PyList_Type, &pgs, &PyList_Type, &specs, &PyList_Type, &dtypes,
                          &PyTuple_Type, &strs, &PyTuple_Type, &consts))
        return NULL;
    PyObject *out = NULL;
    RbPriv *p = NULL;
    struct ArrowArray *root = NULL;
    RbStr *t_pgname = NULL, *t_backend = NULL, *t_op = NULL, *t_dtname = NULL;
    RbStr *t_str[4] = {NULL, NULL, NULL, NULL};
    long long *t_pgsize = NULL, *t_isz = NULL;
    unsigned char *t_inplace = NULL;
    Py_ssize_t n_pg = PyList_GET_SIZE(pgs), n_sp = PyList_GET_SIZE(specs);
    Py_ssize_t n_dt = PyList_GET_SIZE(dtypes), n_str[4] = {0, 0, 0, 0};
    long long *tmp = NULL;
    int *itmp = NULL;
    unsigned char *btmp = NULL;
    int ncols = (int)bp.len;
    if (n < 0 || bn.len < (Py_ssize_t)sizeof(long long) * 10 * n ||
        bc.len < (Py_ssize_t)sizeof(int) * 7 * n || ncols > RB_MAX_COLS ||
        PyTuple_GET_SIZE(strs) != 4 || PyTuple_GET_SIZE(consts) != 2 ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(consts, 0)) ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(consts, 1))) {
        PyErr_SetString(PyExc_ValueError, "records_batch: bad arguments");
        goto done;
    }
    const unsigned char *prog = (const unsigned char *)bp.buf;
    for (int j = 0; j < ncols; j++) {
        if (!((prog[j] >= RB_KIND && prog[j] < RB_LAST_ID) ||
              (prog[j] >= RB_NULL_I64 && prog[j] <= RB_NULL_LIST64))) {
            PyErr_SetString(PyExc_ValueError, "records_batch: bad program");
            goto done;
        }
    }
    /* the tables, as C arrays (their objects live as long as the arguments) */
    size_t tn = (size_t)(n_pg + n_sp + n_dt + 1);
    t_pgname = PyMem_RawCalloc(tn, sizeof(RbStr));
    t_backend = PyMem_RawCalloc(tn, sizeof(RbStr));
    t_op = PyMem_RawCalloc(tn, sizeof(RbStr));
    t_dtname = PyMem_RawCalloc(tn, sizeof(RbStr));
    t_pgsize = PyMem_RawCalloc(tn, sizeof(long long));
    t_isz = PyMem_RawCalloc(tn, sizeof(long long));
    t_inplace = PyMem_RawCalloc(tn, 1);
    if (!t_pgname || !t_backend || !t_op || !t_dtname || !t_pgsize || !t_isz || !t_inplace) {
        PyErr_NoMemory();
        goto done;
    }
    for (int s = 0; s < 4; s++) {
        PyObject *l = PyTuple_GET_ITEM(strs, s);
        if (!PyList_Check(l)) {
            PyErr_SetString(PyExc_TypeError, "records_batch: strs are lists");
            goto done;
        }
        n_str[s] = PyList_GET_SIZE(l);
        /* api (s == 1): its own entries, then the specs' apis (code n_str[1] + fact) */
        t_str[s] = PyMem_RawCalloc((size_t)(n_str[s] + (s == 1 ? n_sp : 0) + 1), sizeof(RbStr));
        if (t_str[s] == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (rb_strs(l, t_str[s], n_str[s]) < 0)
            goto done;
    }
    for (Py_ssize_t t = 0; t < n_pg; t++) {
        PyObject *e = PyList_GET_ITEM(pgs, t);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) {
            PyErr_SetString(PyExc_TypeError, "records_batch: pgs are (name, size, backend)");
            goto done;
        }
        PyObject *l3 = PyTuple_GET_ITEM(e, 0), *b3 = PyTuple_GET_ITEM(e, 2);
        PyObject *tmpl = PyList_New(2);
        if (tmpl == NULL)
            goto done;
        Py_INCREF(l3); Py_INCREF(b3);
        PyList_SET_ITEM(tmpl, 0, l3);
        PyList_SET_ITEM(tmpl, 1, b3);
        RbStr two[2];
        int bad = rb_strs(tmpl, two, 2) < 0 || rb_ll(PyTuple_GET_ITEM(e, 1), &t_pgsize[t]) < 0;
        Py_DECREF(tmpl);   /* the strings stay alive in `pgs` */
        if (bad)
            goto done;
        t_pgname[t] = two[0];
        t_backend[t] = two[1];
    }
    for (Py_ssize_t t = 0; t < n_sp; t++) {
        PyObject *e = PyList_GET_ITEM(specs, t);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) {
            PyErr_SetString(PyExc_TypeError, "records_batch: specs are (op, api, in place)");
            goto done;
        }
        PyObject *o3 = PyTuple_GET_ITEM(e, 0), *a3 = PyTuple_GET_ITEM(e, 1);
        if ((o3 != Py_None && !PyBytes_CheckExact(o3)) || (a3 != Py_None && !PyBytes_CheckExact(a3))) {
            PyErr_SetString(PyExc_TypeError, "records_batch: table values are bytes or None");
            goto done;
        }
        t_op[t].s = o3 == Py_None ? NULL : PyBytes_AS_STRING(o3);
        t_op[t].len = o3 == Py_None ? 0 : PyBytes_GET_SIZE(o3);
        t_str[1][n_str[1] + t].s = a3 == Py_None ? NULL : PyBytes_AS_STRING(a3);
        t_str[1][n_str[1] + t].len = a3 == Py_None ? 0 : PyBytes_GET_SIZE(a3);
        int ip = PyObject_IsTrue(PyTuple_GET_ITEM(e, 2));
        if (ip < 0)
            goto done;
        t_inplace[t] = (unsigned char)ip;
    }
    for (Py_ssize_t t = 0; t < n_dt; t++) {
        PyObject *e = PyList_GET_ITEM(dtypes, t);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
            PyErr_SetString(PyExc_TypeError, "records_batch: dtypes are (name, itemsize)");
            goto done;
        }
        PyObject *d3 = PyTuple_GET_ITEM(e, 0);
        if (d3 != Py_None && !PyBytes_CheckExact(d3)) {
            PyErr_SetString(PyExc_TypeError, "records_batch: table values are bytes or None");
            goto done;
        }
        t_dtname[t].s = d3 == Py_None ? NULL : PyBytes_AS_STRING(d3);
        t_dtname[t].len = d3 == Py_None ? 0 : PyBytes_GET_SIZE(d3);
        if (rb_ll(PyTuple_GET_ITEM(e, 1), &t_isz[t]) < 0)
            goto done;
        if (t_isz[t] < 0)
            t_isz[t] = NONE_LL;
    }
    RbStr consts_t[2];
    consts_t[0].s = PyBytes_AS_STRING(PyTuple_GET_ITEM(consts, 0));
    consts_t[0].len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(consts, 0));
    consts_t[1].s = PyBytes_AS_STRING(PyTuple_GET_ITEM(consts, 1));
    consts_t[1].len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(consts, 1));

    p = (RbPriv *)calloc(1, sizeof(RbPriv));
    root = (struct ArrowArray *)calloc(1, sizeof(struct ArrowArray));
    tmp = (long long *)PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(long long));
    itmp = (int *)PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(int));
    btmp = (unsigned char *)PyMem_RawMalloc((size_t)(n ? 2 * n : 2));
    void *zeros = p ? rb_alloc(p, (size_t)(n + 1) * 8, 1) : NULL;
    if (!p || !root || !tmp || !itmp || !btmp || !zeros) {
        PyErr_NoMemory();
        goto done;
    }
    const long long *nums = (const long long *)bn.buf;
    const int *codes = (const int *)bc.buf;
    const long long *seq = nums, *peer = nums + n, *rootv = nums + 2 * n, *t0 = nums + 3 * n;
    const long long *step = nums + 4 * n, *opid = nums + 5 * n, *count = nums + 6 * n;
    const long long *outb = nums + 7 * n, *t1 = nums + 8 * n, *thread = nums + 9 * n;
    const int *fact = codes, *pgc = codes + n, *k_site = codes + 2 * n;
    const int *k_api = codes + 3 * n, *k_detail = codes + 4 * n, *k_dtype = codes + 5 * n;
    const int *k_dev = codes + 6 * n;
    for (Py_ssize_t i = 0; i < n; i++) {   /* codes out of their tables: refused */
        if (fact[i] < 0 || fact[i] >= n_sp || pgc[i] < 0 || pgc[i] >= n_pg ||
            k_dtype[i] >= n_dt) {
            PyErr_SetString(PyExc_ValueError, "records_batch: a code outside its table");
            goto done;
        }
    }
    int r = 1, t1_col = -1;
    /* The columns are built without the GIL: from here on only C arrays are read (the
     * arguments, bytes and tuples the caller holds, stay alive and unchanged), and a rank's
     * training thread runs meanwhile (the writer thread's flush held it throughout before). */
    Py_BEGIN_ALLOW_THREADS
    for (int j = 0; j < ncols && r == 1; j++) {
        int id = prog[j];
        Py_ssize_t i;
        switch (id) {
        case RB_KIND:
            memset(itmp, 0, (size_t)n * sizeof(int));
            r = rb_str(p, j, itmp, &consts_t[0], 1, n);
            break;
        case RB_RANK:
            for (i = 0; i < n; i++)
                tmp[i] = rank;
            r = rb_int(p, j, tmp, n, 4);
            break;
        case RB_PG: r = rb_str(p, j, pgc, t_pgname, n_pg, n); break;
        case RB_BACKEND: r = rb_str(p, j, pgc, t_backend, n_pg, n); break;
        case RB_PG_SIZE:
            for (i = 0; i < n; i++)
                tmp[i] = t_pgsize[pgc[i]];
            r = rb_int(p, j, tmp, n, 4);
            break;
        case RB_SEQ: r = rb_int(p, j, seq, n, 8); break;
        case RB_OP: r = rb_str(p, j, fact, t_op, n_sp, n); break;
        case RB_API:   /* the call's own (a value), else the wrapper's */
            for (i = 0; i < n; i++) {
                int c = k_api[i];
                itmp[i] = (c >= 0 && c < n_str[1] && t_str[1][c].s != NULL)
                          ? c : (int)n_str[1] + fact[i];
            }
            r = rb_str(p, j, itmp, t_str[1], n_str[1] + n_sp, n);
            break;
        case RB_ASYNC:
            memset(btmp, 0, (size_t)n);
            r = rb_bool(p, j, btmp, NULL, n);
            break;
        case RB_DEVICE: r = rb_str(p, j, k_dev, t_str[3], n_str[3], n); break;
        case RB_DTYPE: r = rb_str(p, j, k_dtype, t_dtname, n_dt, n); break;
        case RB_COUNT: r = rb_int(p, j, count, n, 8); break;
        case RB_BYTES:
        case RB_OUT_BYTES:
            for (i = 0; i < n; i++) {   /* bytes = count * the dtype's itemsize */
                int d = k_dtype[i];
                long long isz = d >= 0 ? t_isz[d] : NONE_LL;
                long long b = (count[i] != NONE_LL && isz != NONE_LL) ? count[i] * isz : NONE_LL;
                if (id == RB_OUT_BYTES)   /* the recorded value, else bytes in place, else 0 */
                    b = outb[i] != NONE_LL ? outb[i] : t_inplace[fact[i]] ? b
                        : b != NONE_LL ? 0 : NONE_LL;
                tmp[i] = b;
            }
            r = rb_int(p, j, tmp, n, 8);
            break;
        case RB_PEER: r = rb_int(p, j, peer, n, 4); break;
        case RB_ROOT: r = rb_int(p, j, rootv, n, 4); break;
        case RB_T0: r = rb_int(p, j, t0, n, 8); break;
        case RB_T_RETURN:
        case RB_T_END:   /* the same values (a blocking call ends at its return): one copy */
            if (t1_col >= 0) {
                p->cols[j] = p->cols[t1_col];
                p->bufs[j][0] = p->bufs[t1_col][0];
                p->bufs[j][1] = p->bufs[t1_col][1];
            } else {
                r = rb_int(p, j, t1, n, 8);
                t1_col = j;
            }
            break;
        case RB_STEP: r = rb_int(p, j, step, n, 8); break;
        case RB_SITE: r = rb_str(p, j, k_site, t_str[0], n_str[0], n); break;
        case RB_OP_ID: r = rb_int(p, j, opid, n, 8); break;
        case RB_FIRST:
            for (i = 0; i < n; i++) {
                btmp[i] = seq[i] == 0;
                btmp[n + i] = seq[i] != NONE_LL;
            }
            r = rb_bool(p, j, btmp, btmp + n, n);
            break;
        case RB_THREAD: r = rb_int(p, j, thread, n, 8); break;
        case RB_DETAIL: r = rb_str(p, j, k_detail, t_str[2], n_str[2], n); break;
        case RB_COMPLETION:
            for (i = 0; i < n; i++)
                itmp[i] = t1[i] != NONE_LL ? 0 : -1;
            r = rb_str(p, j, itmp, &consts_t[1], 1, n);
            break;
        default:
            rb_null(p, j, id, zeros, n);
        }
        p->cols[j].buffers = p->bufs[j];
        p->col_ptrs[j] = &p->cols[j];
    }
    Py_END_ALLOW_THREADS
    if (r < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (r == 0) {   /* an int32 value out of range, or 2 GiB of text: the general route */
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    root->length = n;
    root->null_count = 0;
    root->offset = 0;
    root->n_buffers = 1;
    p->root_bufs[0] = NULL;
    root->buffers = p->root_bufs;
    root->n_children = ncols;
    root->children = p->col_ptrs;
    root->dictionary = NULL;
    root->private_data = p;
    root->release = rb_release;
    out = PyCapsule_New(root, "arrow_array", rb_capsule_free);
    if (out == NULL) {
        rb_release(root);
        free(root);
    }
    p = NULL;
    root = NULL;
done:
    if (p != NULL) {
        for (int i = 0; i < p->n_mem; i++)
            free(p->mem[i]);
        free(p);
    }
    free(root);
    PyMem_RawFree(t_pgname); PyMem_RawFree(t_backend); PyMem_RawFree(t_op);
    PyMem_RawFree(t_dtname); PyMem_RawFree(t_pgsize); PyMem_RawFree(t_isz);
    PyMem_RawFree(t_inplace);
    for (int s = 0; s < 4; s++)
        PyMem_RawFree(t_str[s]);
    PyMem_RawFree(tmp); PyMem_RawFree(itmp); PyMem_RawFree(btmp);
    PyBuffer_Release(&bn);
    PyBuffer_Release(&bc);
    PyBuffer_Release(&bp);
    return out;
}

/* in_progress(take=False) -> list of pre of the blocking calls in progress. take=True: they
 * are written now as never completed, and not queued again when their call returns. */
static PyObject *in_progress(PyObject *module, PyObject *args) {
    int take = 0;
    if (!PyArg_ParseTuple(args, "|p", &take))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < MAX_INPROG; i++) {
        if (!((H.inprog_used >> i) & 1) || ((H.inprog_taken >> i) & 1))
            continue;
        if (take)
            H.inprog_taken |= 1ULL << i;
        PyObject *pre = rec_pre(*inprog_ref(i));
        if (pre == NULL || PyList_Append(out, pre) != 0)
            CLEAR_ERR();
        Py_XDECREF(pre);
    }
    return out;
}

/* take_dropped() -> calls not recorded since the last take (buffer full). */
static PyObject *take_dropped(PyObject *module, PyObject *unused) {
    unsigned long long n = n_dropped;
    n_dropped = 0;
    return PyLong_FromUnsignedLongLong(n);
}

/* buffered() -> calls completed and not yet drained. */
static PyObject *buffered(PyObject *module, PyObject *unused) {
    return PyLong_FromSsize_t(H.buf_len);
}

/* (The recorder's fixed fields, read once per recorder: H.c_*, above.) */

/* H's copies of its Counters' arrays, after k (any Counters) grew or H.c_* changed. */
static void counters_sync(PyObject *k) {
    Counters *a = (Counters *)H.c_counters, *b = (Counters *)H.c_tseqs;
    if (k != NULL && (a == NULL || (PyObject *)CT_BASE(a) != k) &&
            (b == NULL || (PyObject *)CT_BASE(b) != k))
        return;
    /* c_seq_v[2 * slot], c_tseq_v[2 * slot]: each one's lane of its base's array */
    H.c_seq_v = a != NULL && CT_BASE(a)->v != NULL ? CT_BASE(a)->v + CT_LANE(a) : NULL;
    H.c_seq_n = a != NULL ? CT_BASE(a)->n : 0;
    H.c_tseq_v = a != NULL && b != NULL && CT_BASE(a) == CT_BASE(b) && CT_BASE(b)->v != NULL
                 ? CT_BASE(b)->v + CT_LANE(b) : NULL;   /* paired: bound c_seq_n */
}

/* op_ids's next value back into the object (it is no longer H's), or into H.c_op_next. */
static void opids_detach(void) {
    if (H.c_op_c) {
        OpIds *o = (OpIds *)H.c_op_ids;
        o->next = H.c_op_next;
        o->cell = &o->next;
        H.c_op_c = 0;
    }
}

static void opids_attach(void) {
    if (H.c_op_ids != NULL && Py_TYPE(H.c_op_ids) == &OpIdsType) {
        OpIds *o = (OpIds *)H.c_op_ids;
        H.c_op_next = o->next;
        o->cell = &H.c_op_next;
        H.c_op_c = 1;
    }
}

static PyObject *rd_props[2];   /* rd_props(): Recorder.step, Recorder.device_timer */

/* A blocking op holds the recorder borrowed from H.e_rec (H.n_busy counts them): it does
 * not write the recorder's refcount line (one memory line per cold op at 2 ranks, issue 20,
 * session 20). So H lets go of a recorder (e_rec, c_rec) here: at once when no op holds one,
 * else into H.retired until the last such op ends (rec_busy_end). Steals o. */
static COLD void rec_retire(PyObject *o) {
    if (o == NULL)
        return;
    if (H.n_busy == 0) {
        Py_DECREF(o);
        return;
    }
    if (H.retired == NULL)
        H.retired = PyList_New(0);
    if (H.retired == NULL || PyList_Append(H.retired, o) != 0) {
        CLEAR_ERR();
        return;   /* kept for good (o's reference not released): never freed while held */
    }
    Py_DECREF(o);
}

/* The last op that held a recorder borrowed ended: release what was retired meanwhile (its
 * finalizers may run Python code: the caller's exception is kept). */
static COLD void rec_retired_release(void) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    Py_CLEAR(H.retired);
    CLEAR_ERR();
    PyErr_Restore(et, ev, etb);
}

static inline void rec_busy_end(void) {
    if (--H.n_busy == 0 && UNLIKELY(H.retired != NULL))
        rec_retired_release();
}

static COLD int cache_recorder(FastCtx *c, PyObject *rec) {
    if (H.c_rec == rec)
        return 0;
    H.c_rd_notify = 0;
    opids_detach();
    H.e_rd_ok = 0;   /* read from the old c_rdict */
    {
        PyObject *old = H.c_rec;
        H.c_rec = NULL;
        rec_retire(old);
    } Py_CLEAR(H.c_seq); Py_CLEAR(H.c_p2p_seq); Py_CLEAR(H.c_op_ids);
    Py_CLEAR(H.c_rank); Py_CLEAR(H.c_rdict); Py_CLEAR(H.c_counters); Py_CLEAR(H.c_tseqs);
    counters_sync(NULL);
    H.c_rdict = dict_of(rec);
    H.c_tseqs = PyObject_GetAttr(rec, s_tseqs);
    if (H.c_tseqs != NULL && !PyObject_TypeCheck(H.c_tseqs, &CountersType))
        Py_CLEAR(H.c_tseqs);
    CLEAR_ERR();
    H.c_counters = PyObject_GetAttr(rec, s_seqs);
    if (H.c_counters != NULL && !PyObject_TypeCheck(H.c_counters, &CountersType))
        Py_CLEAR(H.c_counters);
    CLEAR_ERR();
    H.c_seq = PyObject_GetAttr(rec, s_seq);
    H.c_p2p_seq = PyObject_GetAttr(rec, s_p2p_seq);
    H.c_op_ids = PyObject_GetAttr(rec, s_op_ids);
    H.c_rank = PyObject_GetAttr(rec, s_rank);
    PyObject *st = PyObject_GetAttr(rec, s_stack);
    PyObject *now = PyObject_GetAttr(rec, s_now_ns);
    PyObject *cap = PyObject_GetAttr(rec, s_cap);
    int ok = H.c_seq && PyDict_Check(H.c_seq) && H.c_p2p_seq && PyDict_Check(H.c_p2p_seq) &&
             H.c_op_ids && PyIter_Check(H.c_op_ids) && H.c_rank && st && now && cap;
    if (ok) {
        H.c_stack = PyObject_IsTrue(st) == 1;
        H.c_now_ok = now == c->time_ns;   /* no injected skew, no custom clock */
        Py_ssize_t n = PyLong_AsSsize_t(cap);
        if (n > 0)
            H.buf_max = n;
        buf_lim_set();
    }
    Py_XDECREF(st); Py_XDECREF(now); Py_XDECREF(cap);
    CLEAR_ERR();
    counters_sync(NULL);
    if (!ok) {
        Py_CLEAR(H.c_seq); Py_CLEAR(H.c_p2p_seq); Py_CLEAR(H.c_op_ids); Py_CLEAR(H.c_rank);
        return -1;
    }
    opids_attach();
    H.c_rec = rec;
    Py_INCREF(rec);
    H.c_rd_notify = rd_props[0] != NULL &&
        _PyType_Lookup(Py_TYPE(rec), s_step) == rd_props[0] &&
        _PyType_Lookup(Py_TYPE(rec), s_device_timer) == rd_props[1];
    return 0;
}

/* ---------------------------------------------------------------------------------------
 * Collectives the group issued that no recorded call claims (torchseq.py): after a recorded
 * call, torch's own per-group sequence number (ProcessGroup._get_sequence_number_for_group())
 * is read once; a plain collective issues exactly one number, so it claimed (hi - 1, hi]. A
 * point-to-point op (NCCL does not number them, gloo does) also reads the number before the
 * call, except on a group whose backend numbers each one (PgInfo.p2p_one: gloo), where it is
 * read once as a collective's is (issue 20: the read before a blocking send/recv was a cold
 * pybind call releasing the GIL, a few us per op of the pipeline sample). Numbers between the last claimed one and this call's first are a gap: handed to
 * torchseq.on_gap, rarely. Errors are cleared, never raised.
 * ------------------------------------------------------------------------------------- */
/* (H.ts_gap: torchseq.on_gap(rec, name, last, lo, op_id, seq), NULL: off) */
/* Where the number of a blocking call is read. Right after the call returns, the thread has
 * slept in wait() while gloo's threads, the other ranks and other processes ran: its caches
 * are cold, and torch's getter (a pybind call that releases the GIL) cost 2.3-2.5 us of CPU
 * per op at 2 ranks (median, load 5-7; 0.15-0.5 us warm). Between the call's issue and its
 * wait() it finds warm what the issue just touched (pybind's dispatch, the group): the call
 * sets tl.tseq_g to its group, Work.wait (wait_vectorcall) reads the number into tl.tseq_hi
 * before waiting, and the call uses it after it returns (a call whose wait did not run, or a
 * Work whose wait commtrace does not wrap, reads it after the call as before). The number
 * is taken when the op is issued, so both reads see the same value. */
/* (tl.tseq_g: borrowed, the call holds it; tl.tseq_hi: read at wait(), -1: not read) */
/* (H.ts_at_wait: 0: read after the call (benchmarks/gapcheck.py compares)) */

/* (H.ts_type: strong: the type whose getter ts_fn is) */
static PyObject *ts_fn;                  /* type(g)._get_sequence_number_for_group, a builtin */

/* (H.n_tseq_reads: torch seq reads (tseq_reads(): tests)) */

static long long tseq_got(PyObject *v) {
    long long x = as_ll(v);
    Py_XDECREF(v);
    if (x == NONE_LL || x < 0) {
        CLEAR_ERR();
        return -1;
    }
    return x;
}

/* A group of another type than the last one read (H.ts_type): its getter looked up. The
 * number (or -1), or -2 when ts_fn is now type(g)'s getter (tseq_read calls it). */
static COLD long long tseq_read_new(PyObject *g) {
    /* torch's getter is a pybind builtin on the class: called with the group as its
     * argument, with no bound method made per call. A Python override, or an instance
     * attribute, is called the ordinary way. */
    PyObject *f = PyObject_GetAttr((PyObject *)Py_TYPE(g), s_get_tseq);
    PyObject *gd = f == NULL ? NULL : dict_of(g);
    int own = gd != NULL && PyDict_GetItemWithError(gd, s_get_tseq) != NULL;
    Py_XDECREF(gd);
    CLEAR_ERR();
    if (f != NULL && PyCFunction_Check(f) && !own) {
        Py_XSETREF(ts_fn, f);
        Py_INCREF(Py_TYPE(g));
        Py_XSETREF(H.ts_type, Py_TYPE(g));
        return -2;
    }
    Py_XDECREF(f);
    return tseq_got(PyObject_CallMethodNoArgs(g, s_get_tseq));
}

static long long tseq_read(PyObject *g) {
    H.n_tseq_reads++;
    if (UNLIKELY(Py_TYPE(g) != H.ts_type)) {
        long long x = tseq_read_new(g);
        if (x != -2)
            return x;
    }
    if (LIKELY(H.mt_pg_seq != NULL)) {
        long long x;
        if (H.mt_pg_seq(g, &x) == 1) {
            H.n_meta_s++;
            return x < 0 ? -1 : x;
        }
    }
    return tseq_got(PyObject_CallOneArg(ts_fn, g));
}

/* A gap (rare): torchseq.on_gap(rec, name, last, lo, op_id, seq). name NULL: the group g's
 * name, from the wrapper c while g is still its last group (c holds the name then), else from
 * the Python side's group cache (a blocking call does not hold its group's name through the
 * call: one refcount line less per op). */
static COLD void tseq_gap(FastCtx *c, PyObject *rec, PyObject *g, PyObject *name,
                          long long last, long long lo, long long op_id, long long seq) {
    PyObject *own = NULL;
    if (name == NULL && c != NULL) {
        if (c->last_key == g && c->last_name != NULL) {
            name = c->last_name;
        } else {
            PyObject *inf = PyDict_GetItemWithError(c->pg_cache, g);
            own = inf == NULL ? NULL : PyObject_GetAttr(inf, s_name);
            name = own;
        }
    }
    if (name != NULL) {
        PyObject *x = PyObject_CallFunction(H.ts_gap, "OOLLLL", rec, name, last, lo, op_id, seq);
        Py_XDECREF(x);
    }
    Py_XDECREF(own);
    CLEAR_ERR();
}

/* c: the blocking call's wrapper (name NULL, see tseq_gap), or NULL with the name. */
static void tseq_after(FastCtx *c, PyObject *rec, PyObject *g, Py_ssize_t slot, PyObject *name,
                       long long lo, long long op_id, long long seq, long long hi) {
    /* (H.c_tseq_v != NULL implies H.c_tseqs != NULL: its pair, one array) */
    if (H.ts_gap == NULL || slot < 0 || (H.c_tseq_v == NULL && H.c_tseqs == NULL))
        return;
    if (hi < 0)   /* not read at the call's wait(): read it now */
        hi = tseq_read(g);
    /* torch's getter releases the GIL: another thread may have switched the recorder */
    if (hi < 0 || (H.c_tseq_v == NULL && H.c_tseqs == NULL) || H.c_rec != rec)
        return;
    if (lo < 0)
        lo = hi - 1;
    /* H.c_tseqs (another line) only off the common case */
    int here = H.c_tseq_v != NULL && slot < H.c_seq_n;   /* the array in H, else k's */
    long long last = here ? H.c_tseq_v[2 * slot] : counters_get((Counters *)H.c_tseqs, slot);
    if (UNLIKELY(lo > last)) {
        Counters *k = (Counters *)H.c_tseqs;
        Py_INCREF(k);   /* on_gap is Python code */
        tseq_gap(c, rec, g, name, last, lo, op_id, seq);
        if (hi > last)
            counters_set(k, slot, hi);
        Py_DECREF(k);
    } else if (hi > last) {
        if (LIKELY(here))
            H.c_tseq_v[2 * slot] = hi;
        else
            counters_set((Counters *)H.c_tseqs, slot, hi);
    }
}

/* set_tseq_at_wait(flag) -> the previous flag: a blocking call's number read at its wait()
 * (1, the default) or after the call returns (0). */
static PyObject *set_tseq_at_wait(PyObject *module, PyObject *arg) {
    return swap_flag_c(&H.ts_at_wait, arg);
}

/* tseq_reads() -> the number of reads of torch's sequence number so far (tests). */
static PyObject *tseq_reads(PyObject *module, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(H.n_tseq_reads);
}

/* set_tseq(on_gap or None): turn the gap check on (off). */
static PyObject *set_tseq(PyObject *module, PyObject *fn) {
    if (fn == Py_None) {
        Py_CLEAR(H.ts_gap);
    } else {
        Py_INCREF(fn);
        Py_XSETREF(H.ts_gap, fn);
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * The async path: calls with async_op=True (DDP's comm hook, FSDP2's collectives, user code
 * that overlaps) recorded with no Python frame per op. Its semantics are the Python path's,
 * which it mirrors line for line (keep them in step):
 *   wrappers._run / _finish          -> as_issue (the row, the call, in flight meanwhile)
 *   wrappers._track_work             -> as_track (Work with a future: callback or polling)
 *   Recorder.add_pending / complete  -> as_track / as_complete
 *   wrappers._make_wait's wait       -> as_wait
 *   Recorder._release / append_row   -> as_release / as_append
 * The first Work of each wrapper (and any Work of another type, a Work without a future, a
 * pending op with siblings, a device token or an NVTX range) goes through the Python functions.
 * ------------------------------------------------------------------------------------- */
/* The Work.wait wrapper (its methods are further down). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *orig, *slow, *recmod, *recmod_d;
} WaitW;

static PyObject *s_by_key;
static int as_on;                   /* set_async() called: the async path is usable */
static PyObject *as_pending_type;   /* recorder.PendingOp */
static PyObject *as_track_py;       /* wrappers._track_work(rec, row, work, tensors, token) */
static PyObject *as_error_py;       /* wrappers._record_error(rec, row, t1, exc) */
static PyObject *as_kind_op;        /* schema.KIND_OP */
static PyObject *as_specs, *as_pgfacts, *as_dtnames, *as_dtname_fn;  /* recorder's tables */
static unsigned long long n_async;  /* async calls recorded here */
static PyObject *s_get_future, *s_add_done_callback, *s_acquire, *s_release, *s_notify,
    *s_wake, *s_itemsize, *s_dropped, *s_by_storage, *s_pending, *s_ready, *s_pend_lock,
    *s_listeners, *s_blocking, *s_config, *s_hazards, *s_off, *s_async_completion, *s_wait_s,
    *s_name_attr, *s_append_m, *s_lazy_idle, *s_idle_owed, *s_polled;

/* Row columns (schema order, as recorder.expand writes them; checked in set_async). */
enum { C_KIND, C_RANK, C_PG, C_PG_SIZE, C_SEQ, C_OP, C_API, C_ASYNC, C_BACKEND, C_DEVICE,
       C_DTYPE, C_COUNT, C_BYTES, C_OUT_BYTES, C_PEER, C_ROOT, C_T_ENQ, C_T_RET, C_T_START,
       C_T_END, C_T_WAIT, C_T_WAIT_END, C_STEP, C_SITE, C_ERROR, C_OP_ID, C_REF_OP_ID,
       C_INFLIGHT, C_INFLIGHT_IDS, C_FIRST, C_STREAM_WAIT, C_THREAD, C_DETAIL, C_COMPLETION,
       C_TORCH_SEQ, C_NCOL };
static const char *c_names[C_NCOL] = {
    "kind", "rank", "pg", "pg_size", "seq", "op", "api", "async_op", "backend", "device",
    "dtype", "count", "bytes", "out_bytes", "peer", "root", "t_enqueue_ns", "t_return_ns",
    "t_start_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns", "step", "site", "error", "op_id",
    "ref_op_id", "inflight", "inflight_ids", "first_on_pg", "stream_wait_ns", "thread",
    "detail", "completion", "torch_seq"};
/* Column completion: how t_end_ns was obtained (Recorder.complete's `how`). */
static PyObject *s_how_callback, *s_how_observed, *s_how_wait, *s_done, *s_is_completed;

/* PendingOp's __slots__, written at their offsets (no __init__ frame). */
enum { P_OP_ID, P_OP, P_API, P_TENSORS, P_ASYNC, P_WAITED, P_ROW, P_WORK, P_WORK_REF,
       P_HAS_FUTURE, P_T_DONE, P_DEVTOK, P_KEY, P_SKEYS, P_SIBLINGS, P_NVTX, P_N };
static const char *p_names[P_N] = {
    "op_id", "op", "api", "tensors", "async_op", "waited", "row", "work", "work_ref",
    "has_future", "t_done_seen", "device_token", "key", "skeys", "siblings", "nvtx_range"};
static Py_ssize_t p_off[P_N];

static inline PyObject *pget(PyObject *p, int i) {   /* borrowed; None when unset */
    if (p_off[i] < 0)
        return Py_None;
    PyObject *v = *(PyObject **)((char *)p + p_off[i]);
    return v ? v : Py_None;
}

static inline void pset(PyObject *p, int i, PyObject *v) {
    if (p_off[i] < 0)
        return;
    PyObject **a = (PyObject **)((char *)p + p_off[i]);
    Py_INCREF(v);
    Py_XSETREF(*a, v);
}

/* The recorder's containers, read once per recorder. */
static struct {
    PyObject *rec;   /* strong */
    PyObject *ready, *pending, *by_key, *lock, *listeners, *blocking;
    PyObject *rdict;  /* its __dict__: lazy_idle, _idle_owed (Recorder._tell_idle / _busy) */
    PyObject *acquire, *release;   /* _pend_lock's bound methods (no lookup per op) */
    int hazards;     /* tensors kept for hazard detection (config.hazards != "off") */
    int hz_full;     /* config.hazards == "full" */
    int callback;    /* completion from the future's callback (config.async_completion) */
    int now_ok;      /* rec.now_ns is time.time_ns (no injected skew): this clock is its */
    Py_ssize_t cap;
} acst;
static PyObject *as_time_ns;   /* time.time_ns */

static int as_cache(PyObject *rec) {
    if (acst.rec == rec)
        return 0;
    Py_CLEAR(acst.rec); Py_CLEAR(acst.ready); Py_CLEAR(acst.pending); Py_CLEAR(acst.by_key);
    Py_CLEAR(acst.lock); Py_CLEAR(acst.listeners); Py_CLEAR(acst.blocking);
    Py_CLEAR(acst.rdict); Py_CLEAR(acst.acquire); Py_CLEAR(acst.release);
    acst.rdict = dict_of(rec);
    acst.ready = PyObject_GetAttr(rec, s_ready);
    acst.pending = PyObject_GetAttr(rec, s_pending);
    acst.by_key = PyObject_GetAttr(rec, s_by_key);
    acst.lock = PyObject_GetAttr(rec, s_pend_lock);
    if (acst.lock != NULL) {
        acst.acquire = PyObject_GetAttr(acst.lock, s_acquire);
        acst.release = PyObject_GetAttr(acst.lock, s_release);
    }
    acst.listeners = PyObject_GetAttr(rec, s_listeners);
    acst.blocking = PyObject_GetAttr(rec, s_blocking);
    PyObject *cap = PyObject_GetAttr(rec, s_cap);
    PyObject *cfg = PyObject_GetAttr(rec, s_config);
    PyObject *hz = cfg ? PyObject_GetAttr(cfg, s_hazards) : NULL;
    PyObject *mode = cfg ? PyObject_GetAttr(cfg, s_async_completion) : NULL;
    PyObject *now = PyObject_GetAttr(rec, s_now_ns);
    acst.now_ok = now != NULL && now == as_time_ns;
    Py_XDECREF(now);
    CLEAR_ERR();
    int ok = acst.ready && acst.pending && PyDict_Check(acst.pending) && acst.by_key &&
             PyDict_Check(acst.by_key) && acst.lock && acst.listeners &&
             PyList_Check(acst.listeners) && acst.blocking && PyDict_Check(acst.blocking) &&
             acst.rdict != NULL && acst.acquire != NULL && acst.release != NULL &&
             cap && PyLong_Check(cap) && hz && PyUnicode_Check(hz);
    if (ok) {
        acst.cap = PyLong_AsSsize_t(cap);
        acst.hazards = PyUnicode_Compare(hz, s_off) != 0;
        acst.hz_full = PyUnicode_CompareWithASCIIString(hz, "full") == 0;
        acst.callback = !(mode != NULL && PyUnicode_Check(mode) &&
                          PyUnicode_Compare(mode, s_wait_s) == 0);
    }
    Py_XDECREF(cap); Py_XDECREF(cfg); Py_XDECREF(hz); Py_XDECREF(mode);
    CLEAR_ERR();
    if (!ok) {
        Py_CLEAR(acst.ready); Py_CLEAR(acst.pending); Py_CLEAR(acst.by_key);
        Py_CLEAR(acst.lock); Py_CLEAR(acst.listeners); Py_CLEAR(acst.blocking);
        Py_CLEAR(acst.rdict); Py_CLEAR(acst.acquire); Py_CLEAR(acst.release);
        return -1;
    }
    acst.rec = rec;
    Py_INCREF(rec);
    return 0;
}

/* acst for `rec` again after a call that released the GIL (another thread may have cached
 * another recorder meanwhile). 0: ok. */
static inline int as_recache(PyObject *rec) {
    return acst.rec == rec ? 0 : as_cache(rec);
}

static NOINLINE int as_usable(PyObject *rec) {
    return as_on && as_cache(rec) == 0 && acst.now_ok;
}

/* Recorder.append_row: queue a finished row (dropped and counted when the buffer is full). */
static void as_add_dropped(PyObject *rec) {
    PyObject *d = PyObject_GetAttr(rec, s_dropped);
    PyObject *d1 = d ? PyNumber_Add(d, i_one) : NULL;
    if (d1)
        PyObject_SetAttr(rec, s_dropped, d1);
    Py_XDECREF(d); Py_XDECREF(d1);
    CLEAR_ERR();
}

static void as_append(PyObject *rec, PyObject *row) {
    Py_ssize_t n = PyObject_Length(acst.ready);
    if (n < 0) {
        CLEAR_ERR();
        return;
    }
    if (n >= acst.cap) {
        as_add_dropped(rec);
        return;
    }
    PyObject *x = PyObject_CallMethodOneArg(acst.ready, s_append_m, row);
    Py_XDECREF(x);
    CLEAR_ERR();
}

/* PendLock: the recorder's pending-op lock (Recorder._pend_lock) where this module is built.
 * A threading.Lock as Python uses it (`with`, acquire / release, locked), whose acquire and
 * release the async path takes here without a Python call: threading.Lock's acquire parses
 * its (blocking, timeout) arguments with PyArg_ParseTupleAndKeywords on every call, and the
 * path took it twice per async op (the insert, and the release at a C++ DDP stamp). A
 * contended acquire waits with the GIL released, as threading.Lock's; it is not interrupted
 * by signals (the lock is held for a few dict operations). */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lk;
    int held;
} PendLock;

static PyTypeObject PendLockType;

static inline void plock_acquire(PendLock *l) {
    if (!PyThread_acquire_lock(l->lk, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(l->lk, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    l->held = 1;
}

static inline int plock_release(PendLock *l) {
    if (!l->held) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    l->held = 0;
    PyThread_release_lock(l->lk);
    return 0;
}

static PyObject *plock_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) != 0 || (kw != NULL && PyDict_GET_SIZE(kw) != 0)) {
        PyErr_SetString(PyExc_TypeError, "PendLock() takes no arguments");
        return NULL;
    }
    PendLock *l = (PendLock *)tp->tp_alloc(tp, 0);
    if (l == NULL)
        return NULL;
    l->lk = PyThread_allocate_lock();
    if (l->lk == NULL) {
        Py_DECREF(l);
        return PyErr_NoMemory();
    }
    l->held = 0;
    return (PyObject *)l;
}

static void plock_dealloc(PendLock *l) {
    if (l->lk != NULL) {
        if (l->held)
            PyThread_release_lock(l->lk);
        PyThread_free_lock(l->lk);
    }
    Py_TYPE(l)->tp_free((PyObject *)l);
}

/* acquire(blocking=True, timeout=-1) -> bool, as threading.Lock's */
static PyObject *plock_acquire_m(PendLock *l, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    int blocking = 1;
    double timeout = -1.0;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "acquire(blocking=True, timeout=-1)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        int is_timeout = i < nargs ? i == 1 :
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i - nargs),
                                             "timeout") == 0;
        if (!is_timeout && i >= nargs &&
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i - nargs),
                                             "blocking") != 0) {
            PyErr_SetString(PyExc_TypeError, "acquire(blocking=True, timeout=-1)");
            return NULL;
        }
        if (is_timeout) {
            timeout = PyFloat_AsDouble(args[i]);
            if (timeout == -1.0 && PyErr_Occurred())
                return NULL;
        } else {
            blocking = PyObject_IsTrue(args[i]);
            if (blocking < 0)
                return NULL;
        }
    }
    if (!blocking && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (PyThread_acquire_lock(l->lk, NOWAIT_LOCK)) {
        l->held = 1;
        Py_RETURN_TRUE;
    }
    if (!blocking)
        Py_RETURN_FALSE;
    PyLockStatus r;
    long long us = timeout < 0 ? -1 : (long long)(timeout * 1e6);
    Py_BEGIN_ALLOW_THREADS
    r = PyThread_acquire_lock_timed(l->lk, us, 0);
    Py_END_ALLOW_THREADS
    if (r == PY_LOCK_ACQUIRED) {
        l->held = 1;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *plock_enter(PendLock *l, PyObject *unused) {
    plock_acquire(l);
    Py_RETURN_TRUE;
}

static PyObject *plock_release_m(PendLock *l, PyObject *unused) {
    if (plock_release(l) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *plock_exit(PendLock *l, PyObject *const *args, Py_ssize_t nargs) {
    if (plock_release(l) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *plock_locked(PendLock *l, PyObject *unused) {
    return PyBool_FromLong(l->held);
}

static PyMethodDef plock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))plock_acquire_m, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", (PyCFunction)plock_release_m, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)plock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)plock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))plock_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PendLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._fastpath.PendLock",
    .tp_basicsize = sizeof(PendLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = plock_new,
    .tp_dealloc = (destructor)plock_dealloc,
    .tp_methods = plock_methods,
    .tp_doc = "The recorder's pending-op lock: a threading.Lock that the async path takes "
              "without a Python call.",
};

static inline int as_lock(void) {
    if (Py_TYPE(acst.lock) == &PendLockType) {
        plock_acquire((PendLock *)acst.lock);
        return 0;
    }
    PyObject *x = PyObject_CallNoArgs(acst.acquire);
    Py_XDECREF(x);
    if (x == NULL) {
        CLEAR_ERR();
        return -1;
    }
    return 0;
}

static inline void as_unlock(void) {
    if (Py_TYPE(acst.lock) == &PendLockType) {
        plock_release((PendLock *)acst.lock);
        CLEAR_ERR();
        return;
    }
    PyObject *x = PyObject_CallNoArgs(acst.release);
    Py_XDECREF(x);
    CLEAR_ERR();
}

/* Recorder._notify: the pending-op listeners (hazard detection), called directly. A listener
 * that raises is handed to _notify, which logs it once (and calls the listeners again). */
static void as_notify(PyObject *rec, int count) {
    Py_ssize_t n_l = PyList_GET_SIZE(acst.listeners);
    if (n_l == 0)
        return;
    PyObject *n = PyLong_FromLong(count);
    if (n == NULL) {
        CLEAR_ERR();
        return;
    }
    PyObject *ls = PyList_GetSlice(acst.listeners, 0, n_l);   /* list(self._listeners) */
    int failed = ls == NULL;
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(ls); i++) {
        PyObject *x = PyObject_CallOneArg(PyList_GET_ITEM(ls, i), n);
        if (x == NULL)
            failed = 1;
        Py_XDECREF(x);
    }
    Py_XDECREF(ls);
    if (failed) {
        CLEAR_ERR();
        PyObject *x = PyObject_CallMethodOneArg(rec, s_notify, n);
        Py_XDECREF(x);
    }
    Py_DECREF(n);
    CLEAR_ERR();
}

/* Recorder._tell_idle / _tell_busy: the pending count went >0 -> 0 / 0 -> >0. With
 * lazy_idle (hazard detection's basic mode) the 0 is owed to the writer thread, and a 0 -> >0
 * while it is owed tells nothing: no listener call per op in a loop of one op and its wait. */
static void as_tell_idle(PyObject *rec) {
    if (PyList_GET_SIZE(acst.listeners) == 0)
        return;
    PyObject *lazy = PyDict_GetItemWithError(acst.rdict, s_lazy_idle);
    if (lazy == Py_True) {
        if (PyDict_SetItem(acst.rdict, s_idle_owed, Py_True) == 0)
            return;
    }
    CLEAR_ERR();
    as_notify(rec, 0);
}

static void as_tell_busy(PyObject *rec) {
    if (PyList_GET_SIZE(acst.listeners) == 0)
        return;
    PyObject *owed = PyDict_GetItemWithError(acst.rdict, s_idle_owed);
    if (owed == Py_True) {
        if (PyDict_SetItem(acst.rdict, s_idle_owed, Py_False) == 0)
            return;
    }
    CLEAR_ERR();
    as_notify(rec, 1);
}

/* Recorder.complete: keep the earliest completion time, and how it was obtained. */
static void as_complete(PyObject *row, long long t, PyObject *how) {
    PyObject *cur = PyList_GET_ITEM(row, C_T_END);
    if (cur != Py_None) {
        long long v = PyLong_AsLongLong(cur);
        if (v == -1 && PyErr_Occurred()) {
            CLEAR_ERR();
            return;
        }
        if (t >= v)
            return;
    }
    PyObject *o = PyLong_FromLongLong(t);
    if (o == NULL || PyList_SetItem(row, C_T_END, o) != 0) {
        CLEAR_ERR();
        return;
    }
    Py_INCREF(how);
    PyList_SetItem(row, C_COMPLETION, how);
}

/* Recorder._release: move a pending op to the write queue. */
static void as_release(PyObject *rec, PyObject *p) {
    PyObject *opid = pget(p, P_OP_ID);
    if (as_lock() != 0)
        return;
    PyObject *had = PyDict_GetItemWithError(acst.pending, opid);
    int popped = had != NULL && PyDict_DelItem(acst.pending, opid) == 0;
    Py_ssize_t n = PyDict_GET_SIZE(acst.pending);
    as_unlock();
    CLEAR_ERR();
    if (!popped)
        return;
    PyObject *key = pget(p, P_KEY);
    if (key != Py_None && PyDict_GetItemWithError(acst.by_key, key) == p)
        PyDict_DelItem(acst.by_key, key);
    CLEAR_ERR();
    PyObject *skeys = pget(p, P_SKEYS);
    if (PyTuple_Check(skeys) && PyTuple_GET_SIZE(skeys) > 0) {
        PyObject *bs = PyObject_GetAttr(rec, s_by_storage);
        if (bs != NULL && PyDict_Check(bs)) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(skeys); i++) {
                PyObject *k = PyTuple_GET_ITEM(skeys, i);
                if (PyDict_GetItemWithError(bs, k) == p)
                    PyDict_DelItem(bs, k);
            }
        }
        Py_XDECREF(bs);
        CLEAR_ERR();
    }
    pset(p, P_WORK, Py_None);
    PyObject *empty = PyTuple_New(0);
    if (empty != NULL) {
        pset(p, P_TENSORS, empty);
        Py_DECREF(empty);
    }
    as_append(rec, pget(p, P_ROW));
    if (n == 0)
        as_tell_idle(rec);
}

/* Whether the pending op p (a PendingOp) is one whose release C decides (service_pass, and
 * as_release_stamped at a C++ hook's stamp): its row a full list with t_end set, no device
 * token, no NVTX range, its work_ref None or a weak reference. Then 1, with *waited
 * (p.waited) and *alive (PendingOp.work_alive: a strong Work, or a weak one still there);
 * else 0, and the Python loop decides. Reads only; no error left set. */
static int pending_releasable(PyObject *p, int *waited, int *alive) {
    if (Py_TYPE(p) != (PyTypeObject *)as_pending_type)
        return 0;
    PyObject *row = pget(p, P_ROW), *wref = pget(p, P_WORK_REF);
    if (!PyList_CheckExact(row) || PyList_GET_SIZE(row) != C_NCOL ||
        PyList_GET_ITEM(row, C_T_END) == Py_None || pget(p, P_DEVTOK) != Py_None ||
        pget(p, P_NVTX) != Py_None || (wref != Py_None && !PyWeakref_CheckRef(wref)))
        return 0;
    int w = PyObject_IsTrue(pget(p, P_WAITED));
    if (w < 0) {
        CLEAR_ERR();
        w = 0;
    }
    *waited = w;
    *alive = pget(p, P_WORK) != Py_None ||
             (wref != Py_None && PyWeakref_GetObject(wref) != Py_None);
    return 1;
}

/* service_pass(rec, ops, now, hold_ns) -> list: the writer thread's service (Recorder._service,
 * not the final one) over the pending ops `ops` (a list of PendingOp), for the ops whose end
 * time is known and that have no device token and no NVTX range: each gets its t_done_seen
 * (now, if unset) and is released (as_release: Recorder._release) when waited, when its Work
 * is gone, or once completed for hold_ns; the others are returned, untouched, for the Python
 * loop (an op still in flight: its polling and its dropped result are Python's). A sparse
 * loop's ops (DDP's buckets) are all of the first kind: the Python loop cost ~1.7 us per op
 * on the writer thread, GIL held (docs/performance.md, session 16). Where the async path is
 * off every op is returned. */
static PyObject *service_pass(PyObject *module, PyObject *args) {
    PyObject *rec, *ops;
    long long now, hold;
    if (!PyArg_ParseTuple(args, "OO!LL", &rec, &PyList_Type, &ops, &now, &hold))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ops);
    if (!as_on || p_off[P_T_DONE] < 0 || as_pending_type == NULL || as_cache(rec) != 0) {
        CLEAR_ERR();
        return PyList_GetSlice(ops, 0, n);
    }
    PyObject *rest = PyList_New(0);
    if (rest == NULL)
        return NULL;
    PyObject *now_o = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* The ops' objects are out of the caches after a quarter second of training (their
         * misses are what this pass costs): ask for them ahead, the op 8 on, what it points
         * to 4 on, its row's items 2 on, each read once arrived (no effect on what is read). */
        if (i + 8 < n)
            __builtin_prefetch(PyList_GET_ITEM(ops, i + 8));
        if (i + 4 < n) {
            PyObject *q = PyList_GET_ITEM(ops, i + 4);
            if (Py_TYPE(q) == (PyTypeObject *)as_pending_type) {
                __builtin_prefetch(pget(q, P_ROW));
                __builtin_prefetch(pget(q, P_WORK_REF));
                __builtin_prefetch(pget(q, P_OP_ID));
                __builtin_prefetch(pget(q, P_KEY));
            }
        }
        if (i + 2 < n) {
            PyObject *q = PyList_GET_ITEM(ops, i + 2);
            PyObject *r = Py_TYPE(q) == (PyTypeObject *)as_pending_type ? pget(q, P_ROW) : NULL;
            if (r != NULL && PyList_CheckExact(r) && PyList_GET_SIZE(r) == C_NCOL)
                __builtin_prefetch(&PyList_GET_ITEM(r, C_T_END));
        }
        PyObject *p = PyList_GET_ITEM(ops, i);
        int waited, alive;
        PyObject *td = NULL;
        long long t_done = now;
        if (!pending_releasable(p, &waited, &alive) ||
            ((td = pget(p, P_T_DONE)) != Py_None &&
             (!PyLong_CheckExact(td) ||
              ((t_done = PyLong_AsLongLong(td)) == -1 && PyErr_Occurred())))) {
            CLEAR_ERR();
            if (PyList_Append(rest, p) != 0)
                goto fail;
            continue;
        }
        if (td == Py_None) {
            if (now_o == NULL && (now_o = PyLong_FromLongLong(now)) == NULL)
                goto fail;
            pset(p, P_T_DONE, now_o);
        }
        if (waited || !alive || now - t_done >= hold)
            as_release(rec, p);
        if (as_recache(rec) != 0) {   /* a listener ran Python: the rest to the Python loop */
            CLEAR_ERR();
            PyObject *tail = PyList_GetSlice(ops, i + 1, n);
            if (tail == NULL || PyList_SetSlice(rest, PyList_GET_SIZE(rest),
                                                PyList_GET_SIZE(rest), tail) != 0) {
                Py_XDECREF(tail);
                goto fail;
            }
            Py_DECREF(tail);
            break;
        }
    }
    Py_XDECREF(now_o);
    return rest;
fail:
    Py_XDECREF(now_o);
    Py_DECREF(rest);
    return NULL;
}

/* A completion callback of one async op (runs on the backend's thread, GIL held): it stamps
 * the op's row with the time it ran. The future's done-callback (done_vectorcall) and the DDP
 * hook's continuation (ddp_then_vectorcall, below) are this object with their own vectorcall. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *row;   /* NULL: nothing to stamp (the op's stamp is someone else's) */
    int attaching;   /* run at once by add_done_callback / then: the op ended while attached */
} DoneCB;

static PyTypeObject DoneType;

/* A new callback for row (a new reference to it is taken), attaching until its caller says. */
static DoneCB *done_new(PyObject *row, vectorcallfunc vc) {
    DoneCB *cb = PyObject_New(DoneCB, &DoneType);
    if (cb == NULL)
        return NULL;
    cb->vectorcall = vc;
    cb->row = row;
    Py_XINCREF(row);
    cb->attaching = 1;
    return cb;
}

/* Recorder.complete of the callback's row at t: "observed" while attaching, else "callback". */
static void done_stamp(DoneCB *d, long long t) {
    if (d->row != NULL)
        as_complete(d->row, t, d->attaching ? s_how_observed : s_how_callback);
}

static PyObject *done_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    done_stamp((DoneCB *)self, now_ns());
    Py_RETURN_NONE;
}

/* Completion stamps of the C++ callbacks (set_meta_api's capsule, version 2: work_attach),
 * queued on the backend's thread without the GIL, written into their rows here (GIL held):
 * by the op's wait() (before it completes the row), by the next async call, and by the writer
 * thread's service (flush_stamps, in recorder.STAMP_FLUSHERS). */
static void stamp_row(PyObject *row, long long t, int observed) {
    if (PyList_Check(row) && PyList_GET_SIZE(row) == C_NCOL)
        as_complete(row, t, observed ? s_how_observed : s_how_callback);
}

static void stamps_flush_now(void) {
    if (mt_stamps_n != NULL && __atomic_load_n(mt_stamps_n, __ATOMIC_ACQUIRE) != 0) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        mt_stamps_flush(stamp_row);
        CLEAR_ERR();
        PyErr_Restore(et, ev, etb);
    }
}

/* flush_stamps() -> None: write the queued completion stamps into their rows. */
static PyObject *flush_stamps(PyObject *module, PyObject *unused) {
    stamps_flush_now();
    Py_RETURN_NONE;
}

/* set_cxx_completion(flag) -> previous: an async op's completion callback in C++ (1, the
 * default, where the capsule has it) or through its future's Python add_done_callback (0). */
static PyObject *set_cxx_completion(PyObject *module, PyObject *arg) {
    return swap_flag(&cxx_completion, arg);
}

/* attach_counts() -> completions attached in C++ so far (tests). */
static PyObject *attach_counts(PyObject *module, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(n_meta_attach);
}

static void done_dealloc(DoneCB *d) {
    Py_CLEAR(d->row);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyTypeObject DoneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._fastpath.Done",
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    VECTORCALL_SLOTS(DoneCB, done_dealloc),
    .tp_doc = "Completion callback of one async op recorded by commtrace (a future's "
              "done-callback, or a DDP bucket's continuation).",
};

/* The full row of an async call (recorder.expand(rank, pre, None) of its record). */
static int untrack_rows = 1;   /* set_untrack_rows(): benchmarks/async_gc.py compares */

static PyObject *set_untrack_rows(PyObject *module, PyObject *arg) {
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    untrack_rows = v;
    Py_RETURN_NONE;
}

static PyObject *as_row(Rec *r) {
    PyObject *spec = PyList_GetItem(as_specs, r->fact);     /* (op, api, inplace) */
    PyObject *pgf = PyList_GetItem(as_pgfacts, r->pgidx);   /* (name, size, backend) */
    if (spec == NULL || pgf == NULL || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3 ||
        !PyTuple_Check(pgf) || PyTuple_GET_SIZE(pgf) != 3)
        return NULL;
    PyObject *dtn = NULL, *b = NULL, *ob = NULL;
    if (r->dtype != NULL && r->dtype != Py_None) {
        dtn = PyDict_GetItemWithError(as_dtnames, r->dtype);
        if (dtn != NULL)
            Py_INCREF(dtn);
        else
            dtn = PyObject_CallOneArg(as_dtname_fn, r->dtype);
        if (dtn == NULL)
            return NULL;
        if (r->count != NONE_LL) {
            PyObject *isz = PyObject_GetAttr(r->dtype, s_itemsize);
            long long v = isz ? PyLong_AsLongLong(isz) : -1;
            Py_XDECREF(isz);
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(dtn);
                return NULL;
            }
            b = PyLong_FromLongLong(r->count * v);
        }
    } else {
        dtn = Py_None;
        Py_INCREF(dtn);
    }
    if (b == NULL) {
        CLEAR_ERR();
        b = Py_None;
        Py_INCREF(b);
    }
    if (r->outb != NONE_LL)
        ob = PyLong_FromLongLong(r->outb);
    else if (b != Py_None)
        ob = PyTuple_GET_ITEM(spec, 2) == Py_True ? (Py_INCREF(b), b) : PyLong_FromLong(0);
    else
        ob = (Py_INCREF(Py_None), Py_None);
    PyObject *api = r->api;
    int t = api != NULL ? PyObject_IsTrue(api) : 0;
    if (t != 1) {
        CLEAR_ERR();
        api = PyTuple_GET_ITEM(spec, 1);
    }
    PyObject *row = PyList_New(C_NCOL);
    if (row == NULL || ob == NULL) {
        Py_XDECREF(row); Py_XDECREF(ob); Py_DECREF(b); Py_DECREF(dtn);
        return NULL;
    }
    PyObject *v[C_NCOL];
    for (int i = 0; i < C_NCOL; i++)
        v[i] = NULL;
    v[C_KIND] = as_kind_op; Py_INCREF(as_kind_op);
    v[C_RANK] = H.c_rank; Py_INCREF(H.c_rank);
    v[C_PG] = PyTuple_GET_ITEM(pgf, 0); Py_INCREF(v[C_PG]);
    v[C_PG_SIZE] = PyTuple_GET_ITEM(pgf, 1); Py_INCREF(v[C_PG_SIZE]);
    v[C_SEQ] = ll_obj(r->seq);
    v[C_OP] = PyTuple_GET_ITEM(spec, 0); Py_INCREF(v[C_OP]);
    v[C_API] = api; Py_INCREF(api);
    v[C_ASYNC] = Py_True; Py_INCREF(Py_True);
    v[C_BACKEND] = PyTuple_GET_ITEM(pgf, 2); Py_INCREF(v[C_BACKEND]);
    v[C_DEVICE] = r->dev ? r->dev : Py_None; Py_INCREF(v[C_DEVICE]);
    v[C_DTYPE] = dtn;
    v[C_COUNT] = ll_obj(r->count);
    v[C_BYTES] = b;
    v[C_OUT_BYTES] = ob;
    v[C_PEER] = ll_obj(r->peer);
    v[C_ROOT] = ll_obj(r->root);
    v[C_T_ENQ] = ll_obj(r->t0);
    v[C_STEP] = ll_obj(r->step);
    v[C_SITE] = r->site ? r->site : Py_None; Py_INCREF(v[C_SITE]);
    v[C_OP_ID] = ll_obj(r->op_id);
    v[C_FIRST] = r->seq == NONE_LL ? Py_None : (r->seq == 0 ? Py_True : Py_False);
    Py_INCREF(v[C_FIRST]);
    v[C_THREAD] = PyLong_FromUnsignedLong(r->thread);
    v[C_DETAIL] = r->detail ? r->detail : Py_None; Py_INCREF(v[C_DETAIL]);
    int bad = 0;
    for (int i = 0; i < C_NCOL; i++) {
        if (v[i] == NULL) {
            if (PyErr_Occurred())
                bad = 1;
            v[i] = Py_None;
            Py_INCREF(Py_None);
        }
        PyList_SET_ITEM(row, i, v[i]);
    }
    if (bad) {
        Py_DECREF(row);
        return NULL;
    }
    /* The row holds only atomic values (ints, strings, None, bools, a (file, line) site) and
     * is only ever given such values later (times, completion, error text): it can be part
     * of no reference cycle. Untracked, the rows that wait in the write queue for up to a
     * flush interval are not visited by the cyclic GC, and do not push it into collecting
     * the whole heap: at world size 1 an async all_reduce + wait loop spent 1.2 us of GC per
     * op on them, 0.8 of it in full collections of torch's 170k objects (issue 20). */
    if (untrack_rows)
        PyObject_GC_UnTrack(row);
    return row;
}

/* A PendingOp as PendingOp(row, tensors) would make it (its __init__ run in C). */
static PyObject *as_new_pending(PyObject *row, PyObject *tensors) {
    PyTypeObject *tp = (PyTypeObject *)as_pending_type;
    PyObject *p = tp->tp_alloc(tp, 0);
    if (p == NULL)
        return NULL;
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) {
        Py_DECREF(p);
        return NULL;
    }
    for (int i = 0; i < P_N; i++)
        pset(p, i, Py_None);
    pset(p, P_ROW, row);
    pset(p, P_OP_ID, PyList_GET_ITEM(row, C_OP_ID));
    pset(p, P_OP, PyList_GET_ITEM(row, C_OP));
    pset(p, P_API, PyList_GET_ITEM(row, C_API));
    pset(p, P_ASYNC, PyList_GET_ITEM(row, C_ASYNC));
    pset(p, P_TENSORS, tensors);
    pset(p, P_WAITED, Py_False);
    pset(p, P_HAS_FUTURE, Py_False);
    pset(p, P_SKEYS, empty);
    Py_DECREF(empty);
    return p;
}

/* Set by the DDP comm hook (section "DDP's comm hook in C" below) while it issues its
 * all_reduce: as_track then attaches no DoneCB and hands the future and the row over, and the
 * hook's own continuation stamps the completion (one callback on the backend's thread per
 * bucket instead of two). New references; NULLs when not handed over. */
typedef struct {
    PyObject *fut, *row;
    int nofut;   /* the C++ hook, which takes its Work's future in C++: no get_future here */
    int want_dr;   /* the C++ side takes a C record (DRec) where as_issue makes one */
    void *dr;      /* the DRec handed over (its callback's and issuer's references), or NULL */
} DdpTake;
static _Thread_local DdpTake *t_ddp_take;
/* Set by as_issue around its call when the C++ DDP side may issue without a Python Work
 * (t_ddp_take->nofut, completion by callback): ddp_allreduce then has it issue through
 * issue_ar_nopy and returns as_cxx_work, a placeholder that as_track recognizes: the pending
 * op gets no Work, no weak reference and no key (the Work is the C++ side's, never returned to
 * Python: nothing could wait on it there; its end is stamped by the C++ side's callback). */
static _Thread_local int t_as_nopy;
static PyObject *as_cxx_work;   /* the placeholder (an object()) */

/* wrappers._track_work for a Work whose type this wrapper has seen complete through its
 * future (the first of each type goes to the Python function, which also patches the wait()
 * of a Work subclass that has its own). */
static void as_track(FastCtx *c, PyObject *rec, PyObject *row, PyObject *work, PyObject *x,
                     PyObject *y) {
    PyObject *tensors = !acst.hazards ? PyTuple_New(0) :
                        (y != NULL ? PyTuple_Pack(2, x, y) : PyTuple_Pack(1, x));
    if (tensors == NULL) {
        CLEAR_ERR();
        return;
    }
    /* cxxw: the C++ DDP side's Work, kept there (as_cxx_work): a pending op with a future
     * (the C++ side stamps it), no Work, no key */
    int cxxw = work == as_cxx_work && t_ddp_take != NULL && t_ddp_take->nofut;
    int learned = cxxw ||
                  (c->as_work_type != NULL && (PyObject *)Py_TYPE(work) == c->as_work_type);
    int nofut = 0;
    if (learned && !cxxw && c->as_nofut_backend != NULL) {
        /* a Work without a future: tracked here only on the backend it was learned on */
        PyObject *b = PyList_GET_ITEM(row, C_BACKEND);
        learned = nofut = b == c->as_nofut_backend ||
            (PyUnicode_Check(b) && PyUnicode_Compare(b, c->as_nofut_backend) == 0);
        CLEAR_ERR();
    }
    if (!learned) {
        PyObject *p = PyObject_CallFunctionObjArgs(as_track_py, rec, row, work, tensors,
                                                   Py_None, NULL);
        if (p != NULL && Py_TYPE(p) == (PyTypeObject *)as_pending_type &&
            pget(p, P_DEVTOK) == Py_None) {
            if (pget(p, P_HAS_FUTURE) == Py_True || !acst.callback) {
                Py_INCREF(Py_TYPE(work));
                Py_XSETREF(c->as_work_type, (PyObject *)Py_TYPE(work));
                Py_CLEAR(c->as_nofut_backend);
            } else if (pget(p, P_WORK) == work && pget(p, P_NVTX) == Py_None) {
                /* No future (gloo's isend / irecv): tracked here when the writer does not
                 * poll it either (recorder._pollable false: only wait() ends it), so that
                 * the C path need not list it for polling. */
                PyObject *pf = PyObject_GetAttrString(c->recmod, "_pollable");
                PyObject *pv = pf ? PyObject_CallOneArg(pf, row) : NULL;
                if (pv == Py_False) {
                    Py_INCREF(Py_TYPE(work));
                    Py_XSETREF(c->as_work_type, (PyObject *)Py_TYPE(work));
                    PyObject *b = PyList_GET_ITEM(row, C_BACKEND);
                    Py_INCREF(b);
                    Py_XSETREF(c->as_nofut_backend, b);
                }
                Py_XDECREF(pf); Py_XDECREF(pv);
            }
        }
        Py_XDECREF(p);
        Py_DECREF(tensors);
        CLEAR_ERR();
        return;
    }
    PyObject *fut = NULL;
    /* hasfut: the op completes through its Work's future; fut is that future as a Python
     * object, except for the C++ DDP hook, which takes the future in C++ and stamps the
     * completion itself (t_ddp_take->nofut: the pybind call would make a Python object that
     * nothing uses) */
    int hasfut = 0, attached = 0;
    if (cxxw || (acst.callback && !nofut && t_ddp_take != NULL && t_ddp_take->nofut)) {
        hasfut = 1;
    } else if (acst.callback && !nofut && t_ddp_take == NULL && mt_work_attach != NULL &&
               cxx_completion &&
               mt_work_attach(work, row, now_ns) == 1) {
        /* the completion callback is C++ on the Work's future: no get_future() or
         * add_done_callback() pybind call here, no GIL on the backend's thread */
        hasfut = 1;
        attached = 1;
        n_meta_attach++;
    } else if (acst.callback && !nofut) {
        hasfut = 1;
        fut = PyObject_CallMethodNoArgs(work, s_get_future);
        if (fut == NULL) {   /* not this time: the Python function decides */
            CLEAR_ERR();
            PyObject *p = PyObject_CallFunctionObjArgs(as_track_py, rec, row, work, tensors,
                                                       Py_None, NULL);
            Py_XDECREF(p);
            Py_DECREF(tensors);
            CLEAR_ERR();
            return;
        }
    }
    /* Without a callback: one look (is_completed()), and if the op has ended, its end is the
     * moment it was seen complete ("observed", an upper bound). With one, no look: torch runs
     * the callback of a future already complete at once, inside add_done_callback, which
     * then completes the row as "observed" (DoneCB.attaching). A look (future.done(), a
     * pybind call) cost 0.3-0.4 us per op and told nothing the attach does not. */
    int done = 0;
    if (!hasfut && (mt_work_done == NULL || mt_work_done(work, &done) != 1)) {
        PyObject *look = PyObject_CallMethodNoArgs(work, s_is_completed);
        done = look == Py_True;
        Py_XDECREF(look);
        CLEAR_ERR();
    }
    long long t_seen = now_ns();
    PyObject *p = as_new_pending(row, tensors);
    Py_DECREF(tensors);
    if (p == NULL) {
        Py_XDECREF(fut);
        CLEAR_ERR();
        return;
    }
    if (cxxw) {
        pset(p, P_HAS_FUTURE, Py_True);   /* work / work_ref None: as a Work already freed */
    } else if (hasfut) {
        pset(p, P_HAS_FUTURE, Py_True);
        PyObject *wr = PyWeakref_NewRef(work, NULL);
        if (wr != NULL) {
            pset(p, P_WORK_REF, wr);
            Py_DECREF(wr);
        } else {
            CLEAR_ERR();
            pset(p, P_WORK, work);
        }
    } else {
        pset(p, P_WORK, work);   /* no callback: polled by the writer thread, or waited */
    }
    PyObject *key = cxxw ? NULL : PyLong_FromVoidPtr(work);
    if (key != NULL) {
        pset(p, P_KEY, key);
        PyDict_SetItem(acst.by_key, key, p);
        Py_DECREF(key);
    }
    CLEAR_ERR();
    Py_ssize_t n0 = -1;
    if (as_lock() == 0) {
        n0 = PyDict_GET_SIZE(acst.pending);
        if (n0 >= acst.cap)
            as_add_dropped(rec);
        else if (PyDict_SetItem(acst.pending, pget(p, P_OP_ID), p) != 0)
            CLEAR_ERR();
        as_unlock();
    }
    if (n0 == 0)
        as_tell_busy(rec);
    if (done)
        as_complete(row, t_seen, s_how_observed);
    if (nofut && acst.callback) {
        /* _track_work's rec.wake(): free unless the writer has other Works to poll */
        PyObject *pl = PyDict_GetItemWithError(acst.rdict, s_polled);   /* no str per op */
        if (pl == NULL || !PyDict_Check(pl) || PyDict_GET_SIZE(pl) > 0) {
            PyObject *z = PyObject_CallMethodNoArgs(rec, s_wake);
            Py_XDECREF(z);
        }
        CLEAR_ERR();
    }
    if (hasfut && t_ddp_take != NULL) {
        /* the DDP hook's continuation stamps its completion (ddp_then, or the C++ hook's) */
        Py_XINCREF(fut); Py_INCREF(row);
        t_ddp_take->fut = fut;
        t_ddp_take->row = row;
    } else if (!done && fut != NULL) {
        DoneCB *cb = done_new(row, done_vectorcall);
        if (cb != NULL) {
            PyObject *x2 = PyObject_CallMethodOneArg(fut, s_add_done_callback, (PyObject *)cb);
            cb->attaching = 0;
            Py_XDECREF(x2);
            Py_DECREF(cb);
        }
        CLEAR_ERR();
    }
    Py_XDECREF(fut);
    if (attached)   /* an op that had ended: its "observed" stamp, written now as before */
        stamps_flush_now();
    n_async++;
    Py_DECREF(p);
}

/* ---------------------------------------------------------------------------------------
 * DDP's buckets as C records (issue 20, session 30). A bucket the C++ side issues without a
 * Python Work (t_ddp_take->want_dr: the recording group) is recorded as a DRec: the blocking
 * path's Rec (op id, seq, step, site, times, ...) plus its completion time, written by the
 * Work's future's callback on the backend's thread without the GIL. No Python row, in-flight
 * entry, pending op or release on the training thread: the writer thread's service
 * (ddp_drain, in Recorder._service) builds the rows of the completed ones in a batch, as
 * as_row builds them, and queues them. The in-flight ones are listed as the blocking calls in
 * progress are (ddp_inflight: Recorder.blocking_rows, so _inflight.json and the hang
 * watchdog see them; ddp_inflight(True): sync capture), and a final flush writes them as never
 * completed. Not tracked for hazard detection: DDP's Reducer waits for every bucket before
 * backward() returns, so no host read of user code can race one (--hazards full keeps them
 * pending ops, as before). ddp_direct(False): the pending-op route for every bucket.
 * Lifetime: three references (the list's, the callback's, the issuer's); the Python objects
 * of the record are released under the GIL by whoever drops it from the list, the memory by
 * the last reference.
 * ------------------------------------------------------------------------------------- */
typedef struct DRec_s {
    Rec r;                     /* r.t1: 0 while the issue runs */
    long long t_end;           /* atomic: 0 until the completion stamp */
    int observed;              /* atomic: the op had ended when its callback was attached */
    int refs;                  /* atomic */
    int attaching;             /* atomic: the callback is being attached (the issuer's thread) */
    int dropped;               /* GIL: no longer in the list (drained, or a final flush took it) */
} DRec;

static DRec **dr_list;
static Py_ssize_t dr_len, dr_cap;
static int dr_on = 1;
static unsigned long long n_dr, n_dr_rows, n_dr_dropped;

static void dr_unref(DRec *d) {
    if (__atomic_sub_fetch(&d->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(d);
}

/* The completion stamp (any thread, no GIL): the earliest time, and whether it was observed
 * (the callback ran inside its attach, on the issuing thread). Drops the callback's reference. */
static void dr_stamp(void *p, long long t) {
    DRec *d = (DRec *)p;
    int obs = __atomic_load_n(&d->attaching, __ATOMIC_ACQUIRE) &&
              (unsigned long)PyThread_get_thread_ident() == d->r.thread;
    /* one stamp per record (its Work's one callback): `observed` first, then the time that
     * publishes it (the writer reads the time, then `observed`) */
    __atomic_store_n(&d->observed, obs, __ATOMIC_RELAXED);
    __atomic_store_n(&d->t_end, t > 0 ? t : 1, __ATOMIC_RELEASE);
    dr_unref(d);
}

/* The callback is attached (the issuer's reference goes). */
static void dr_attached(void *p) {
    DRec *d = (DRec *)p;
    __atomic_store_n(&d->attaching, 0, __ATOMIC_RELEASE);
    dr_unref(d);
}

/* A record's row as the pending-op route writes it (new reference, NULL on error): as_row,
 * the return time, and the completion where stamped. */
static PyObject *dr_row(DRec *d) {
    PyObject *row = as_row(&d->r);
    if (row == NULL)
        return NULL;
    if (d->r.t1 != 0) {
        PyObject *t1 = PyLong_FromLongLong(d->r.t1);
        if (t1 != NULL)
            PyList_SetItem(row, C_T_RET, t1);
    }
    long long te = __atomic_load_n(&d->t_end, __ATOMIC_ACQUIRE);
    if (te != 0)
        as_complete(row, te, __atomic_load_n(&d->observed, __ATOMIC_ACQUIRE) ? s_how_observed
                                                                            : s_how_callback);
    CLEAR_ERR();
    return row;
}

/* Out of the list (GIL): its Python objects released, the list's reference dropped. */
static void dr_drop(DRec *d) {
    d->dropped = 1;
    rec_release(&d->r);
    dr_unref(d);
}

/* d out of the list as a row (a new reference, as dr_row's), or NULL where a final flush wrote
 * it meanwhile (or the row could not be made); the list's, the callback's and the issuer's
 * references go: no callback will be attached (GIL). */
static void dr_unlist(DRec *d);
static PyObject *dr_take_row(DRec *d) {
    if (d->dropped) {
        dr_unref(d);
        dr_unref(d);
        return NULL;
    }
    dr_unlist(d);
    PyObject *row = dr_row(d);
    dr_drop(d);
    dr_unref(d);
    dr_unref(d);
    return row;
}

static int dr_push(DRec *d) {
    if (dr_len >= dr_cap) {
        Py_ssize_t n = dr_cap ? dr_cap * 2 : 256;
        DRec **nl = (DRec **)realloc(dr_list, (size_t)n * sizeof(DRec *));
        if (nl == NULL)
            return -1;
        dr_list = nl;
        dr_cap = n;
    }
    dr_list[dr_len++] = d;
    return 0;
}

static void dr_unlist(DRec *d) {
    for (Py_ssize_t i = dr_len - 1; i >= 0; i--) {
        if (dr_list[i] == d) {
            memmove(dr_list + i, dr_list + i + 1, (size_t)(dr_len - i - 1) * sizeof(DRec *));
            dr_len--;
            return;
        }
    }
}

/* ddp_drain(recorder, final) -> rows queued: the completed records' rows (final: every
 * record's, the ones in flight as never completed) into the recorder's write queue. */
static PyObject *ddp_drain(PyObject *module, PyObject *args) {
    PyObject *rec;
    int final = 0;
    if (!PyArg_ParseTuple(args, "O|p", &rec, &final))
        return NULL;
    if (dr_len == 0)
        return PyLong_FromLong(0);
    if (as_cache(rec) != 0) {
        CLEAR_ERR();
        return PyLong_FromLong(0);
    }
    Py_ssize_t j = 0, n = 0;
    for (Py_ssize_t i = 0; i < dr_len; i++) {
        DRec *d = dr_list[i];
        if (!final && (d->r.t1 == 0 || __atomic_load_n(&d->t_end, __ATOMIC_ACQUIRE) == 0)) {
            dr_list[j++] = d;   /* in flight (or still issuing) */
            continue;
        }
        PyObject *row = dr_row(d);
        if (row != NULL) {
            as_append(rec, row);
            Py_DECREF(row);
            n++;
        }
        CLEAR_ERR();
        dr_drop(d);
    }
    dr_len = j;
    n_dr_rows += (unsigned long long)n;
    return PyLong_FromSsize_t(n);
}

/* ddp_inflight(ids=False) -> rows (ids: op ids) of the records not completed, in issue order;
 * the records stay. */
static PyObject *ddp_inflight(PyObject *module, PyObject *args) {
    int ids = 0;
    if (!PyArg_ParseTuple(args, "|p", &ids))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < dr_len; i++) {
        DRec *d = dr_list[i];
        if (__atomic_load_n(&d->t_end, __ATOMIC_ACQUIRE) != 0)
            continue;
        PyObject *x = ids ? PyLong_FromLongLong(d->r.op_id) : dr_row(d);
        if (x == NULL || PyList_Append(out, x) != 0)
            CLEAR_ERR();
        Py_XDECREF(x);
    }
    return out;
}

/* ddp_forget() -> records forgotten: a forked child's copy of the list (its parent's buckets,
 * whose callbacks run in the parent only) emptied, never written here. Their Python objects are
 * released, their memory left (a callback of the parent's own may still be counted in it). */
static PyObject *ddp_forget(PyObject *module, PyObject *unused) {
    Py_ssize_t n = dr_len;
    for (Py_ssize_t i = 0; i < n; i++) {
        dr_list[i]->dropped = 1;
        rec_release(&dr_list[i]->r);
    }
    dr_len = 0;
    return PyLong_FromSsize_t(n);
}

static PyObject *ddp_direct(PyObject *module, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = dr_on;
    dr_on = on;
    return PyBool_FromLong(was);
}

/* ddp_direct_counts() -> (buckets recorded as C records, rows built from them, records not
 * kept (the in-flight cap), records in the list now). */
static PyObject *ddp_direct_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(KKKn)", n_dr, n_dr_rows, n_dr_dropped, dr_len);
}

#define DR_METHODS                                                                           \
    {"ddp_drain", ddp_drain, METH_VARARGS,                                                   \
     "ddp_drain(recorder, final=False) -> rows of DDP's completed C records queued."},       \
    {"ddp_inflight", ddp_inflight, METH_VARARGS,                                             \
     "ddp_inflight(ids=False) -> rows (ids: op ids) of DDP's C records not completed."},     \
    {"ddp_forget", ddp_forget, METH_NOARGS,                                                  \
     "ddp_forget() -> records dropped unwritten (a forked child's copy of its parent's)."},  \
    {"ddp_direct", ddp_direct, METH_O,                                                       \
     "ddp_direct(on) -> the previous setting: DDP's buckets as C records."},                 \
    {"ddp_direct_counts", ddp_direct_counts, METH_NOARGS,                                    \
     "(records, rows built, records not kept, records listed now)."},                        \
    {"ddp_direct_route_counts", ddp_direct_route_counts, METH_NOARGS,                        \
     "(buckets the recording group recorded without a Python call, buckets it did not)."},


/* wrappers._run + _finish for an async call whose record `r` is built (its references are
 * released here). Returns the call's result (or NULL with its exception set). */
/* The torch seq check of an async call (tseq_after's arguments; g NULL: none). */
typedef struct {
    PyObject *g, *name;
    Py_ssize_t slot;
    long long lo, op_id, seq;
} TseqArgs;

/* as_issue's route for a DRec (the C++ side asked for one, t_ddp_take->want_dr; see "DDP's
 * buckets as C records" above): r's references move into the record, the call is made here,
 * and the record goes to the C++ side (t_ddp_take->dr), which attaches its completion
 * callback. Returns the call's result (NULL with its exception set). */
/* A new DRec for r (its references move in: r holds none after), listed; NULL where not kept
 * (the in-flight cap, no memory: counted as a dropped row). GIL held. */
static DRec *dr_new(PyObject *rec, Rec *r) {
    DRec *d = dr_len < acst.cap ? (DRec *)malloc(sizeof(DRec)) : NULL;
    if (d != NULL) {
        d->r = *r;   /* the references move */
        d->r.t1 = 0;
        d->t_end = 0;
        d->observed = 0;
        d->refs = 3;   /* the list's, the callback's, the issuer's */
        d->attaching = 1;
        d->dropped = 0;
        if (dr_push(d) != 0) {
            rec_release(&d->r);
            free(d);
            d = NULL;
        }
    } else {
        rec_release(r);
    }
    r->own = 0;
    r->site = r->api = r->detail = r->dtype = r->dev = NULL;
    if (d == NULL) {
        n_dr_dropped++;
        as_add_dropped(rec);
        CLEAR_ERR();
    }
    return d;
}

/* After the call of d's op returned at t1 (GIL held; its error, if any, fetched into *et, *ev,
 * *etb): d, to attach dr_stamp to its Work's future (attachable: issued with the C++ side's
 * Work), or NULL: a final flush wrote it meanwhile; or the call raised (its row written with
 * the error, as as_issue writes a raising call's) or gave no Work of the C++ side's (its row
 * written now, no completion known). */
static DRec *dr_after(DRec *d, PyObject *rec, int issued, int attachable, long long t1,
                      PyObject **et, PyObject **ev, PyObject **etb) {
    if (d->dropped) {
        dr_unref(d);
        dr_unref(d);
        return NULL;
    }
    if (issued && attachable && as_recache(rec) == 0) {
        d->r.t1 = t1;
        n_dr++;
        return d;
    }
    if (issued)
        d->r.t1 = t1;
    PyObject *row = dr_take_row(d);
    if (row != NULL && as_recache(rec) == 0) {
        if (!issued) {
            PyErr_NormalizeException(et, ev, etb);
            PyObject *t1o = PyLong_FromLongLong(t1);
            PyObject *z = t1o == NULL ? NULL :
                PyObject_CallFunctionObjArgs(as_error_py, rec, row, t1o, *ev ? *ev : Py_None,
                                             NULL);
            Py_XDECREF(z);
            Py_XDECREF(t1o);
        } else {
            as_append(rec, row);
        }
    }
    Py_XDECREF(row);
    CLEAR_ERR();
    return NULL;
}

static NOINLINE PyObject *as_issue(FastCtx *c, PyObject *rec, Rec *r, PyObject *x, PyObject *y,
                          PyObject *const *args, size_t nargsf, PyObject *kwnames,
                          TseqArgs *ts) {
    stamps_flush_now();   /* earlier ops' completions (a cheap look when none are queued) */
    /* A DDP bucket whose C++ side takes a C record (DRec, "DDP's buckets as C records"), or
     * a row; r's references go to either */
    int as_dr = t_ddp_take != NULL && t_ddp_take->want_dr && t_ddp_take->nofut && dr_on &&
                acst.rec == rec && acst.callback && !acst.hz_full && as_cxx_work != NULL;
    DRec *d = NULL;
    PyObject *row = NULL, *opid = NULL;
    int listed = 0;
    if (as_dr) {
        d = dr_new(rec, r);
    } else {
        row = as_row(r);
        rec_release(r);
        if (row == NULL) {
            CLEAR_ERR();   /* commtrace's own bookkeeping failed: the call runs, unrecorded */
        } else {
            opid = PyList_GET_ITEM(row, C_OP_ID);
            /* In flight while the call runs (_inflight.json): rec._blocking, as the Python
             * path. */
            listed = PyDict_SetItem(acst.blocking, opid, row) == 0;
            CLEAR_ERR();
        }
    }
    tl.depth = 1;
    t_as_nopy = as_dr || (row != NULL && t_ddp_take != NULL && t_ddp_take->nofut &&
                          acst.rec == rec && acst.callback && as_cxx_work != NULL);
    PyObject *ret = PyObject_Vectorcall(c->orig, args, nargsf, kwnames);
    long long t1 = now_ns();
    t_as_nopy = 0;
    tl.depth = 0;
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    if (ts->g != NULL) {
        /* torch's number, read before the completion callback is attached: the getter
         * releases the GIL, and once the callback is attached the backend's thread may be
         * waiting for it (at world size 1 on one CPU the read then cost a thread switch each
         * way). A call that raised may still have issued its number. */
        tseq_after(NULL, rec, ts->g, ts->slot, ts->name, ts->lo, ts->op_id, ts->seq, -1);
        CLEAR_ERR();
    }
    if (d != NULL && ret != NULL && ret != as_cxx_work) {
        /* a Work of Python's (the C++ side's issuer did not take the call): the row's route
         * from here on, its completion through that Work, as before C records (none where a
         * final flush wrote the record while the call ran) */
        row = dr_take_row(d);
        d = NULL;
        if (row != NULL)
            opid = PyList_GET_ITEM(row, C_OP_ID);
        CLEAR_ERR();
    }
    if (row == NULL) {
        /* the DRec's end (the callback's and the issuer's references go to the C++ side with
         * it), or an op not recorded */
        if (d != NULL && (d = dr_after(d, rec, ret != NULL, ret == as_cxx_work, t1, &et, &ev,
                                       &etb)) != NULL)
            t_ddp_take->dr = d;
        CLEAR_ERR();
        PyErr_Restore(et, ev, etb);
        return ret;
    }
    int mine = as_recache(rec) == 0;
    if (mine && listed) {   /* Recorder.end_blocking: False when a final flush already wrote it */
        mine = PyDict_GetItemWithError(acst.blocking, opid) != NULL &&
               PyDict_DelItem(acst.blocking, opid) == 0;
        CLEAR_ERR();
    }
    if (mine) {
        PyObject *t1o = PyLong_FromLongLong(t1);
        if (t1o == NULL) {
            CLEAR_ERR();
        } else if (ret == NULL) {
            PyErr_NormalizeException(&et, &ev, &etb);
            PyObject *z = PyObject_CallFunctionObjArgs(as_error_py, rec, row, t1o,
                                                       ev ? ev : Py_None, NULL);
            Py_XDECREF(z);
            Py_DECREF(t1o);
        } else {
            PyList_SetItem(row, C_T_RET, t1o);   /* steals */
            if (ret == Py_None)
                as_append(rec, row);   /* nothing to wait on: completion unknown */
            else
                as_track(c, rec, row, ret, x, y);
        }
    }
    Py_DECREF(row);
    CLEAR_ERR();
    PyErr_Restore(et, ev, etb);
    return ret;
}

/* The Work.wait wrapper for an op tracked by this path or the Python one: *handled = 0 hands
 * the call to the Python wrapper (siblings, device timer, NVTX range, unusual objects). */
/* A waited row's t_wait_ns (its first wait's start: set unless set already; `zero_unset`: a 0
 * counts as unset, as after a failed wait in wrappers._make_wait) and t_wait_end_ns. */
static void as_set_wait(PyObject *row, long long t0, PyObject *t1o, int zero_unset) {
    PyObject *tw = PyList_GET_ITEM(row, C_T_WAIT);
    if (tw == Py_None || (zero_unset && PyLong_Check(tw) && PyLong_AsLongLong(tw) == 0)) {
        PyObject *t0o = PyLong_FromLongLong(t0);
        if (t0o != NULL)
            PyList_SetItem(row, C_T_WAIT, t0o);
    }
    if (t1o != NULL) {
        Py_INCREF(t1o);
        PyList_SetItem(row, C_T_WAIT_END, t1o);
    }
}

static PyObject *as_wait(WaitW *w, PyObject *rec, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames, int *handled) {
    *handled = 0;
    if (PyVectorcall_NARGS(nargsf) < 1 || as_cache(rec) != 0 || !acst.now_ok)
        return NULL;   /* (an injected clock skew: the Python wrapper reads rec.now_ns) */
    PyObject *self = args[0];
    PyObject *key = PyLong_FromVoidPtr(self);
    if (key == NULL) {
        CLEAR_ERR();
        return NULL;
    }
    PyObject *p = PyDict_GetItemWithError(acst.by_key, key);   /* Recorder.lookup */
    Py_DECREF(key);
    if (p == NULL) {
        if (PyErr_Occurred()) {
            CLEAR_ERR();
            return NULL;
        }
        *handled = 1;   /* not an op in flight: torch's wait */
        return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    }
    if (Py_TYPE(p) != (PyTypeObject *)as_pending_type)
        return NULL;
    PyObject *work = pget(p, P_WORK);
    if (work != Py_None) {
        if (work != self) {
            *handled = 1;
            return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
        }
    } else {
        PyObject *wr = pget(p, P_WORK_REF);
        if (wr != Py_None && (!PyWeakref_Check(wr) || PyWeakref_GetObject(wr) != self)) {
            *handled = 1;
            return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
        }
    }
    if (pget(p, P_SIBLINGS) != Py_None || pget(p, P_DEVTOK) != Py_None ||
        pget(p, P_NVTX) != Py_None)
        return NULL;
    PyObject *row = pget(p, P_ROW);
    if (!PyList_Check(row) || PyList_GET_SIZE(row) != C_NCOL)
        return NULL;
    *handled = 1;
    Py_INCREF(p);
    Py_INCREF(row);
    long long t0 = now_ns();
    PyObject *r = PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    long long t1 = now_ns();
    stamps_flush_now();   /* the op's callback time, if it ran, before the wait's (keeps its own error) */
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *t1o = PyLong_FromLongLong(t1);
    if (r == NULL) {
        PyErr_NormalizeException(&et, &ev, &etb);
        if (PyList_GET_ITEM(row, C_ERROR) == Py_None && ev != NULL) {
            PyObject *tn = PyObject_GetAttr((PyObject *)Py_TYPE(ev), s_name_attr);
            PyObject *msg = tn ? PyUnicode_FromFormat("%S: %S", tn, ev) : NULL;
            if (msg != NULL)
                PyList_SetItem(row, C_ERROR, msg);
            Py_XDECREF(tn);
        }
        CLEAR_ERR();
        as_set_wait(row, t0, t1o, 1);
        pset(p, P_WAITED, Py_True);
    } else {
        as_set_wait(row, t0, t1o, 0);
        if (r != Py_False)
            as_complete(row, t1, s_how_wait);
        pset(p, P_WAITED, Py_True);
        if (PyList_GET_ITEM(row, C_T_END) != Py_None) {
            if (as_recache(rec) == 0)
                as_release(rec, p);
        } else {
            PyObject *z = PyObject_CallMethodNoArgs(rec, s_wake);
            Py_XDECREF(z);
        }
    }
    Py_XDECREF(t1o);
    Py_DECREF(row);
    Py_DECREF(p);
    CLEAR_ERR();
    PyErr_Restore(et, ev, etb);
    return r;
}

/* set_async(PendingOp, track_work, record_error, KIND_OP, recorder_module, columns) */
static PyObject *set_async(PyObject *module, PyObject *args) {
    PyObject *ptype, *track, *err, *kind, *recmod, *cols;
    if (!PyArg_ParseTuple(args, "O!OOUOO", &PyType_Type, &ptype, &track, &err, &kind, &recmod,
                          &cols))
        return NULL;
    /* The schema's columns must be the ones as_row writes, in its order. */
    PyObject *cseq = PySequence_Fast(cols, "columns");
    if (cseq == NULL)
        return NULL;
    int cols_ok = PySequence_Fast_GET_SIZE(cseq) == C_NCOL;
    for (Py_ssize_t i = 0; cols_ok && i < C_NCOL; i++) {
        PyObject *nm = PySequence_Fast_GET_ITEM(cseq, i);
        cols_ok = PyUnicode_Check(nm) && PyUnicode_CompareWithASCIIString(nm, c_names[i]) == 0;
    }
    Py_DECREF(cseq);
    if (!cols_ok) {
        PyErr_SetString(PyExc_ValueError, "the schema's columns are not the async path's");
        return NULL;
    }
    /* The slots of PendingOp: all known (a slot added on the Python side and not here would
     * be left unset), each a member descriptor whose offset we write at. */
    PyObject *slots = PyObject_GetAttrString(ptype, "__slots__");
    if (slots == NULL)
        return NULL;
    PyObject *seq = PySequence_Fast(slots, "__slots__");
    Py_DECREF(slots);
    if (seq == NULL)
        return NULL;
    Py_ssize_t off[P_N];
    for (int i = 0; i < P_N; i++)
        off[i] = -1;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
        PyObject *nm = PySequence_Fast_GET_ITEM(seq, j);
        if (PyUnicode_Check(nm) && PyUnicode_CompareWithASCIIString(nm, "__weakref__") == 0)
            continue;
        int found = -1;
        for (int i = 0; i < P_N; i++)
            if (PyUnicode_Check(nm) && PyUnicode_CompareWithASCIIString(nm, p_names[i]) == 0)
                found = i;
        PyObject *d = found < 0 ? NULL : PyDict_GetItemWithError(((PyTypeObject *)ptype)->tp_dict, nm);
        if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "PendingOp slot %R: not known to the async path", nm);
            return NULL;
        }
        off[found] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    Py_DECREF(seq);
    static const int required[] = {P_OP_ID, P_ROW, P_WORK, P_WORK_REF, P_HAS_FUTURE, P_KEY,
                                   P_WAITED, P_TENSORS, P_SIBLINGS, P_DEVTOK, P_NVTX};
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
        if (off[required[i]] < 0) {
            PyErr_Format(PyExc_ValueError, "PendingOp has no slot %s", p_names[required[i]]);
            return NULL;
        }
    PyObject *specs = PyObject_GetAttrString(recmod, "FAST_SPECS");
    PyObject *pgf = PyObject_GetAttrString(recmod, "PG_FACTS");
    PyObject *dtn = PyObject_GetAttrString(recmod, "_dtype_names");
    PyObject *dtf = PyObject_GetAttrString(recmod, "dtype_name");
    if (!specs || !pgf || !dtn || !dtf || !PyList_Check(specs) || !PyList_Check(pgf) ||
        !PyDict_Check(dtn)) {
        Py_XDECREF(specs); Py_XDECREF(pgf); Py_XDECREF(dtn); Py_XDECREF(dtf);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "recorder tables");
        return NULL;
    }
    PyObject *tm = PyImport_ImportModule("time");
    PyObject *tns = tm ? PyObject_GetAttrString(tm, "time_ns") : NULL;
    Py_XDECREF(tm);
    if (tns == NULL) {
        Py_DECREF(specs); Py_DECREF(pgf); Py_DECREF(dtn); Py_DECREF(dtf);
        return NULL;
    }
    Py_XSETREF(as_time_ns, tns);
    memcpy(p_off, off, sizeof(off));
    Py_XSETREF(as_specs, specs); Py_XSETREF(as_pgfacts, pgf);
    Py_XSETREF(as_dtnames, dtn); Py_XSETREF(as_dtname_fn, dtf);
    Py_INCREF(ptype); Py_XSETREF(as_pending_type, ptype);
    Py_INCREF(track); Py_XSETREF(as_track_py, track);
    Py_INCREF(err); Py_XSETREF(as_error_py, err);
    Py_INCREF(kind); Py_XSETREF(as_kind_op, kind);
    Py_CLEAR(acst.rec);
    as_on = 1;
    Py_RETURN_NONE;
}

static PyObject *async_off(PyObject *module, PyObject *unused) {
    as_on = 0;
    Py_RETURN_NONE;
}

static PyObject *async_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(iK)", as_on, n_async);
}

#define SLOW() do { last_slow_line = __LINE__; goto slow; } while (0)

/* (The entry checks' last answers: H.e_*, above.) */

/* This thread's ThreadSt (tl) for a caller holding the GIL. A dlopen'ed module's thread-local
 * is found through __tls_get_addr (the thread's TCB, the TLS generation, its dtv entries and
 * the module's GOT pair: three to five lines, each a miss on cold caches, twice per blocking
 * op: the wrapper and its Work.wait); while one Python thread calls, its PyThreadState (which
 * CPython's own code keeps warm) and its id find the same block in H's first line (issue 20,
 * session 18). Another thread, or a new one on a reused PyThreadState: the lookup, cached. */
static NOINLINE ThreadSt *thread_st_slow(PyThreadState *ts) {
    ThreadSt *T = &tl;
    H.e_ts = ts;
    H.e_ts_id = ts->id;
    H.e_ts_T = T;
    H.e_thread = PyThread_get_thread_ident();
    return T;
}

static inline ThreadSt *thread_st(void) {
    PyThreadState *ts = PyThreadState_GET();
    if (LIKELY(ts == H.e_ts && ts->id == H.e_ts_id))
        return H.e_ts_T;
    return thread_st_slow(ts);
}

/* The blocking path keeps its common case in ctx_vectorcall and the rest out of line (the
 * functions below, GCC's cold section for the rare ones): at 2 ranks each op starts on cold
 * caches, and every instruction line the common case spans is a miss (issue 20, session 14:
 * ctx_vectorcall was 12 KB with first-sight, error and async code inlined among it). */

/* The recorder after recorder.__dict__ changed (or first call): new reference, or NULL for the
 * Python path. */
static COLD PyObject *ent_rec_refresh(FastCtx *c) {
    H.e_rec_ok = 0;
    PyObject *rec = c->recmod_d != NULL ? PyDict_GetItemWithError(c->recmod_d, s_recorder) : NULL;
    if (rec != NULL) {
        Py_INCREF(rec);
        H.e_recmod_d = c->recmod_d;
        Py_INCREF(rec);
        PyObject *old = H.e_rec;
        H.e_rec = rec;   /* strong: a thread may use it once more after a change */
        rec_retire(old);
        H.e_rec_ok = HAVE_DVER;
        return rec;
    }
    CLEAR_ERR();
    return PyObject_GetAttr(c->recmod, s_recorder);
}

/* This thread's state dict after it changed (or first call): depth 0, no coalescing manager,
 * no object-collective accumulation, else -1 (the Python path); the api / detail overrides of
 * rows issued in this context (borrowed: the dict, which tl.state holds, holds them). */
static COLD int ent_thread_refresh(FastCtx *c, ThreadSt *T, PyObject **api, PyObject **detail) {
    PyObject *st = T->state;
    if (st == NULL) {
        st = PyObject_GetAttr(c->tls, s_dict);
        if (st == NULL || !PyDict_Check(st)) {
            Py_XDECREF(st);
            return -1;
        }
        T->state = st;      /* the thread keeps this reference for good */
    }
    T->st_d = NULL;
    PyObject *tmp = PyDict_GetItemWithError(st, s_depth);
    if (tmp == NULL || !PyLong_CheckExact(tmp) || PyLong_AsLong(tmp) != 0)
        return -1;
    tmp = PyDict_GetItemWithError(st, s_coalesce);
    if (tmp == NULL || tmp != Py_None)
        return -1;
    PyObject *a = PyDict_GetItemWithError(st, s_api);
    PyObject *d = a == NULL && PyErr_Occurred() ? NULL : PyDict_GetItemWithError(st, s_detail);
    CLEAR_ERR();
    *api = a ? a : Py_None;
    *detail = d ? d : Py_None;
    if (HAVE_DVER) {
        T->st_d = st;
        T->st_v = DVER(st);
        T->api = *api;
        T->detail = *detail;
    }
    return 0;
}

/* NVTX ranges (nvtx_ranges.active) after its module's dict changed: 0 when off, else -1. */
static COLD int ent_nvtx_refresh(FastCtx *c) {
    H.e_nvtx_ok = 0;
    PyObject *tmp = c->nvtx_d != NULL ? PyDict_GetItemWithError(c->nvtx_d, s_active) : NULL;
    int in_dict = tmp != NULL;
    if (in_dict) {
        Py_INCREF(tmp);
    } else {
        CLEAR_ERR();
        tmp = PyObject_GetAttr(c->nvtx, s_active);
        if (tmp == NULL)
            return -1;
    }
    int act = PyObject_IsTrue(tmp);
    Py_DECREF(tmp);
    if (act != 0)
        return -1;
    if (in_dict && HAVE_DVER) {
        H.e_nvtx_d = c->nvtx_d;
        H.e_nvtx_ok = 1;
    }
    return 0;
}

/* The device timer in C (_devtimer.Timer, its capsule handed over by set_devtimer_api): with
 * it, a blocking op on a timed device (CUDA) stays on this path: its start and end events are
 * C calls, and its record waits in the recorder's _device_rows for its device times, as the
 * Python path's row does (recorder.hold_device_row). Any other device timer: the Python path. */
typedef struct {
    int version;
    PyTypeObject *type;
    PyObject *(*on_issue)(PyObject *timer, long long op_id);
    void (*on_return)(PyObject *timer, PyObject *token, int blocking);
    void (*abandon)(PyObject *timer, PyObject *token);
} DevTimerApi;
static const DevTimerApi *dt_api;
static PyObject *dt_owner;         /* the capsule */
static PyObject *e_dt;             /* the recorder's device timer (a _devtimer.Timer), or NULL */
static PyObject *dt_prefix;        /* the timed devices' name prefix ("cuda"; tests: "cpu") */
static PyObject *dt_last_dev;      /* the device name last asked about, and its answer */
static int dt_last_timed;
static PyObject *s_device_rows, *s_cap;
static PyObject *dt_rows;          /* e_dt's recorder's _device_rows (strong), and its cap */
static long long dt_cap;

static PyObject *set_devtimer_api(PyObject *module, PyObject *args) {
    PyObject *cap, *prefix;
    if (!PyArg_ParseTuple(args, "OU", &cap, &prefix))
        return NULL;
    if (cap == Py_None) {
        dt_api = NULL;
        Py_CLEAR(dt_owner);
    } else {
        const DevTimerApi *a = PyCapsule_GetPointer(cap, "commtrace._devtimer._C_API");
        if (a == NULL)
            return NULL;
        if (a->version != 1) {
            PyErr_SetString(PyExc_ValueError, "_devtimer's C API: unknown version");
            return NULL;
        }
        dt_api = a;
        Py_INCREF(cap);
        Py_XSETREF(dt_owner, cap);
    }
    Py_INCREF(prefix);
    Py_XSETREF(dt_prefix, prefix);
    Py_CLEAR(dt_last_dev);
    Py_CLEAR(e_dt);
    H.e_rd_ok = 0;   /* read the recorder's device timer again */
    Py_RETURN_NONE;
}

/* The recorder's device timer: None (0, none kept), a C timer (0, kept), else -1 */
static int dt_keep(PyObject *dt) {
    if (dt == Py_None) {
        Py_CLEAR(e_dt);
        Py_CLEAR(dt_rows);
        return 0;
    }
    if (dt_api != NULL && PyObject_TypeCheck(dt, dt_api->type)) {
        Py_INCREF(dt);
        Py_XSETREF(e_dt, dt);
        return 0;
    }
    Py_CLEAR(e_dt);
    Py_CLEAR(dt_rows);
    return -1;
}

/* Whether ops on this device (its name) are timed by the device timer */
static int dt_timed(PyObject *dev) {
    if (dev == dt_last_dev)
        return dt_last_timed;
    int t = dev != NULL && dt_prefix != NULL && PyUnicode_Check(dev) &&
            PyUnicode_Tailmatch(dev, dt_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
    CLEAR_ERR();
    Py_XINCREF(dev);
    Py_XSETREF(dt_last_dev, dev);
    dt_last_timed = t;
    return t;
}

/* A device-timed blocking op's record into the recorder's _device_rows as (pre, t_return_ns),
 * keyed by its op id (recorder.hold_device_row's place; the writer expands it when its device
 * times are read). 0 (r released), or -1 (full or an error: the caller buffers r as usual). */
static int dt_hold(Rec *r) {
    PyObject *d = dt_rows;   /* (ent_rd_refresh read it from this recorder with e_dt) */
    if (d == NULL || dt_cap == NONE_LL || PyDict_GET_SIZE(d) >= dt_cap)
        return -1;
    Py_INCREF(d);
    PyObject *pre = rec_pre(r);
    PyObject *t1 = pre != NULL ? PyLong_FromLongLong(r->t1) : NULL;
    PyObject *item = t1 != NULL ? PyTuple_Pack(2, pre, t1) : NULL;
    PyObject *key = item != NULL ? PyLong_FromLongLong(r->op_id) : NULL;
    int rc = key != NULL ? PyDict_SetItem(d, key, item) : -1;
    Py_XDECREF(key); Py_XDECREF(item); Py_XDECREF(t1); Py_XDECREF(pre); Py_DECREF(d);
    if (rc != 0) {
        CLEAR_ERR();
        return -1;
    }
    rec_release(r);
    return 0;
}

/* H.e_rd_ok's bit for "the recorder has a C device timer" (e_dt set): read from H's line, so a
 * blocking op without one does not read e_dt's (its low bits: 0, 1, 2 as below) */
#define RD_DT 4

static COLD int ent_rd_refresh0(PyObject *rec, long long *step_v);

/* The device timer (None, or a C timer: dt_keep) and the step, from the recorder's __dict__
 * after it changed: 0 with *step_v, or -1 (the Python path). */
static COLD int ent_rd_refresh(PyObject *rec, long long *step_v) {
    int r = ent_rd_refresh0(rec, step_v);
    if (r == 0 && e_dt != NULL) {
        /* the recorder's _device_rows (made once in its __init__) and cap, for dt_hold */
        PyObject *d = PyObject_GetAttr(rec, s_device_rows);
        PyObject *capo = d != NULL ? PyObject_GetAttr(rec, s_cap) : NULL;
        dt_cap = as_ll(capo);
        Py_XDECREF(capo);
        if (d != NULL && !PyDict_Check(d))
            Py_CLEAR(d);
        Py_XSETREF(dt_rows, d);
        CLEAR_ERR();
        H.e_rd_ok |= RD_DT;
    }
    return r;
}

static COLD int ent_rd_refresh0(PyObject *rec, long long *step_v) {
    PyObject *rd = H.c_rdict;
    H.e_rd_ok = 0;
    if (H.c_rd_notify) {
        /* the properties' getters (Python code: a setter may run meanwhile, rd_epoch) */
        unsigned long long ep = H.rd_epoch;
        PyObject *dt = PyObject_GetAttr(rec, s_device_timer);
        if (dt == NULL)
            return -1;
        int bad = dt_keep(dt);
        Py_DECREF(dt);
        if (bad)
            return -1;
        PyObject *step = PyObject_GetAttr(rec, s_step);
        *step_v = as_ll(step);
        Py_XDECREF(step);
        CLEAR_ERR();
        if (ep == H.rd_epoch && H.c_rec == rec) {
            H.e_step = *step_v;
            H.e_rd_ok = 1;
        }
        return 0;
    }
    PyObject *dt = rd != NULL ? PyDict_GetItemWithError(rd, s_device_timer) : NULL;
    int in_dict = dt != NULL;
    if (in_dict) {
        if (dt_keep(dt))
            return -1;
    } else {
        CLEAR_ERR();
        dt = PyObject_GetAttr(rec, s_device_timer);
        if (dt == NULL)
            return -1;
        int bad = dt_keep(dt);
        Py_DECREF(dt);
        if (bad)
            return -1;
    }
    PyObject *step = rd != NULL ? PyDict_GetItemWithError(rd, s_step) : NULL;
    if (step != NULL) {
        Py_INCREF(step);
    } else {
        in_dict = 0;
        CLEAR_ERR();
        step = PyObject_GetAttr(rec, s_step);
    }
    *step_v = as_ll(step);
    Py_XDECREF(step);
    CLEAR_ERR();
    if (in_dict && HAVE_DVER) {
        H.e_rdict_v = DVER(rd);
        H.e_step = *step_v;
        H.e_rd_ok = 2;
    }
    return 0;
}

/* A group not seen last time by this wrapper: its PgInfo facts from the Python side's cache
 * into c. 0, or -1 (not a member, or first sight: the Python path). */
static COLD int group_refresh(FastCtx *c, PyObject *key) {
    PyObject *inf = PyDict_GetItemWithError(c->pg_cache, key);
    PyObject *mem = inf == NULL ? NULL : PyObject_GetAttr(inf, s_member);
    PyObject *idx = mem == NULL ? NULL : PyObject_GetAttr(inf, s_idx);
    PyObject *name = idx == NULL ? NULL : PyObject_GetAttr(inf, s_name);
    int ok = name != NULL && mem == Py_True && PyLong_Check(idx);
    if (ok) {
        Py_INCREF(key);
        Py_XSETREF(c->last_key, key);   /* strong: the address is not reused */
        Py_XSETREF(c->last_name, name);
        name = NULL;
        Py_INCREF(inf);
        Py_XSETREF(c->last_info, inf);
        PyObject *sl = PyObject_GetAttr(inf, s_seq_slot);
        c->last_slot = sl != NULL && PyLong_Check(sl) ? PyLong_AsSsize_t(sl) : -1;
        Py_XDECREF(sl);
        sl = PyObject_GetAttr(inf, s_tseq);
        c->last_tseq = sl == Py_True;
        Py_XDECREF(sl);
        sl = PyObject_GetAttr(inf, s_p2p_one);
        c->last_p2p1 = sl == Py_True;
        Py_XDECREF(sl);
        CLEAR_ERR();
        c->last_idx = (int)PyLong_AsLong(idx);
        c->last_gen = H.pg_gen;
    }
    Py_XDECREF(mem); Py_XDECREF(idx); Py_XDECREF(name);
    return ok ? 0 : -1;
}

/* Objects a record may hold borrowed (Rec.own): id -> the object, for the life of the
 * module. Only dtypes and device names go in (a handful per process), each once. */
static PyObject *kept;

static COLD int keep_obj(PyObject *o) {
    if (kept == NULL && (kept = PyDict_New()) == NULL)
        return -1;
    PyObject *k = PyLong_FromVoidPtr(o);
    int r = k == NULL ? -1 : PyDict_SetItem(kept, k, o);
    Py_XDECREF(k);
    return r;
}

/* The dtype the C++ reads gave (borrowed), kept (keep_obj) as c's last: 0, or -1. */
static COLD int keep_dtype(FastCtx *c, PyObject *dtype) {
    if (keep_obj(dtype) != 0)
        return -1;
    c->last_dtype = dtype;
    return 0;
}

/* The device's name (dev_names[index], filled by the Python path on first sight and never
 * changed): borrowed (kept: keep_obj), kept in c for the next call; NULL (no error) when not
 * named yet. */
static NOINLINE PyObject *dev_name(FastCtx *c, long long dev_v) {
    PyObject *k = PyLong_FromLongLong(dev_v);
    PyObject *dev = k == NULL ? NULL : PyDict_GetItemWithError(c->dev_names, k);
    Py_XDECREF(k);
    if (dev == NULL || keep_obj(dev) != 0)
        return NULL;
    Py_INCREF(dev);
    Py_XSETREF(c->last_dev, dev);
    c->last_dev_v = dev_v;
    return dev;
}

/* The tensor's count, dtype and device name through torch's Python accessors (the C++ reads
 * not built, or not a plain tensor): 0 with new references, or -1 (the Python path). */
static NOINLINE int tensor_facts_py(FastCtx *c, PyObject *x, PyObject **count, PyObject **dtype,
                                    PyObject **dev) {
    PyObject *tmp;
    if (exact_tensor(x)) {
        *count = PyObject_Vectorcall(t_numel, &x, 1, NULL);
        if (*count == NULL)
            return -1;
        *dtype = Py_TYPE(t_dtype)->tp_descr_get(t_dtype, x, (PyObject *)Py_TYPE(x));
        if (*dtype == NULL)
            return -1;
        tmp = PyObject_Vectorcall(t_getdev, &x, 1, NULL);
    } else {
        *count = PyObject_CallMethodNoArgs(x, s_numel);
        if (*count == NULL)
            return -1;
        *dtype = PyObject_GetAttr(x, s_dtype);
        if (*dtype == NULL)
            return -1;
        tmp = PyObject_CallMethodNoArgs(x, s_get_device);
    }
    if (tmp == NULL)
        return -1;
    *dev = PyDict_GetItemWithError(c->dev_names, tmp);
    Py_DECREF(tmp);
    if (*dev == NULL)
        return -1;   /* first tensor on this device: the Python path names it */
    Py_INCREF(*dev);
    return 0;
}

/* a and b the same int (a rank): the same object, or exact ints of equal value. */
static inline int same_rank(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b))
        return 0;
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    CLEAR_ERR();
    return eq == 1;
}

/* rec.p2p_seq[(name, src, dst)] (0 when absent; new reference), and += 1; NULL on error.
 * The key is the context's last one when it names the same group, src and dst (a p2p call
 * site keeps its peer): the dict then finds that very tuple (identity, no item compares) and
 * its hash is kept. A new tuple per op, hashed twice (get, set) and compared item by item with
 * the stored key, was about 1,100 of the 1,450 instructions of peer_root per op (session 16,
 * callgrind of samples/pipeline.py). The dict and its values are the Python path's. */
static PyObject *p2p_seq_next(FastCtx *c, PyObject *d, PyObject *name, PyObject *src,
                              PyObject *dst) {
    PyObject *k = c->p2p_key;
    if (k == NULL || PyTuple_GET_ITEM(k, 0) != name || !same_rank(PyTuple_GET_ITEM(k, 1), src) ||
        !same_rank(PyTuple_GET_ITEM(k, 2), dst)) {
        k = PyTuple_Pack(3, name, src, dst);
        if (k == NULL)
            return NULL;
        Py_hash_t h = PyObject_Hash(k);
        if (h == -1) {
            Py_DECREF(k);
            return NULL;
        }
        Py_XSETREF(c->p2p_key, k);
        c->p2p_hash = h;
    }
    Py_INCREF(k);   /* the dict's operations may run Python code (a key's __eq__) */
    PyObject *seq = dict_next(d, k, c->p2p_hash);
    Py_DECREF(k);
    return seq;
}

/* A point-to-point op's peer and seq ((name, src, dst) in rec.p2p_seq), or a rooted
 * collective's root: 0, or -1 (recv from any source, a bad rank: the Python path). */
static NOINLINE int peer_root(FastCtx *c, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames, PyObject **peer, PyObject **root,
                              PyObject **seq) {
    PyObject *info = c->last_info, *name = c->last_name, *rk = H.c_rank;
    int ret = -1;
    /* strong while __index__ of a user's rank argument may run Python code */
    Py_INCREF(info); Py_INCREF(name); Py_INCREF(rk);
    PyObject *a0 = slot(args, nargs, kwnames, c->r0_i, c->r0_n, c->r0_d);
    PyObject *a1 = slot(args, nargs, kwnames, c->r1_i, c->r1_n, c->r1_d);
    if (c->has_peer) {
        *peer = global_rank(info, a0, a1);
        if (*peer == NULL || *peer == Py_None)
            goto out;   /* recv from any source */
        PyObject *d = H.c_p2p_seq;
        if (d != NULL) {
            Py_INCREF(d);
            *seq = c->is_send ? p2p_seq_next(c, d, name, rk, *peer)
                              : p2p_seq_next(c, d, name, *peer, rk);
            Py_DECREF(d);
        }
    } else {
        *root = global_rank(info, a0, a1);
        if (*root == NULL)
            goto out;
    }
    ret = 0;
out:
    Py_DECREF(rk); Py_DECREF(name); Py_DECREF(info);
    return ret;
}

/* The rarer ways to a row's values, converted into the record here and their objects let go
 * of: ctx_vectorcall keeps no object local for them (issue 20, session 20: its frame was 496
 * bytes, about six lines a cold op wrote; the row's values now go straight into the record). */
static NOINLINE int tensor_facts_rec(FastCtx *c, PyObject *x, Rec *r) {
    PyObject *count = NULL;
    r->dtype = r->dev = NULL;
    int ret = tensor_facts_py(c, x, &count, &r->dtype, &r->dev);
    r->count = count != NULL ? as_ll(count) : NONE_LL;
    Py_XDECREF(count);
    return ret;
}

static NOINLINE int peer_root_rec(FastCtx *c, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames, Rec *r, char *have_seq) {
    PyObject *peer = NULL, *root = NULL, *seq = NULL;
    int ret = peer_root(c, args, nargs, kwnames, &peer, &root, &seq);
    r->peer = peer != NULL ? as_ll(peer) : NONE_LL;
    r->root = root != NULL ? as_ll(root) : NONE_LL;
    if (seq != NULL) {
        r->seq = as_ll(seq);
        *have_seq = 1;
    }
    Py_XDECREF(peer); Py_XDECREF(root); Py_XDECREF(seq);
    return ret;
}

/* The seq from the recorder's dict (no counters array): 0 with r->seq, or -1. */
static NOINLINE int seq_dict_rec(FastCtx *c, Rec *r) {
    PyObject *d = H.c_seq;
    Py_INCREF(d);
    PyObject *seq = dict_next(d, c->last_name, -1);
    Py_DECREF(d);
    if (seq == NULL)
        return -1;
    r->seq = as_ll(seq);
    Py_DECREF(seq);
    return 0;
}

static NOINLINE long long op_id_iter(void) {
    PyObject *o = PyIter_Next(H.c_op_ids);
    long long v = as_ll(o);
    Py_XDECREF(o);
    return v;
}

static NOINLINE int outb_py(PyObject *y, Rec *r) {
    PyObject *o = PyObject_GetAttr(y, s_nbytes);
    if (o == NULL)
        return -1;
    r->outb = as_ll(o);
    Py_DECREF(o);
    return 0;
}

/* A recorded blocking call raised: its error row (on_error), then the torch seq check. */
static COLD void blk_error(FastCtx *c, PyObject *rec, Rec *r, long long t1, PyObject **et,
                           PyObject **ev, PyObject **etb) {
    PyErr_NormalizeException(et, ev, etb);
    PyObject *pre = rec_pre(r);
    PyObject *t1o = PyLong_FromLongLong(t1);
    if (pre != NULL && t1o != NULL) {
        PyObject *x = PyObject_CallFunctionObjArgs(c->on_error, rec, pre, t1o,
                                                   *ev ? *ev : Py_None, NULL);
        Py_XDECREF(x);
    }
    Py_XDECREF(pre);
    Py_XDECREF(t1o);
    rec_release(r);
}

/* The Python wrapper for a call of ddp_issue's that this path hands over: it reads the api /
 * detail from the thread's state dict (tls.api, tls.detail), set for the call and restored
 * after, as ddp.py's Python hook sets them. */
static COLD PyObject *ov_slow(FastCtx *c, ThreadSt *T, PyObject *api, PyObject *detail,
                              PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *st = T->state;
    if (st == NULL) {
        st = PyObject_GetAttr(c->tls, s_dict);
        if (st == NULL || !PyDict_Check(st)) {
            Py_XDECREF(st);
            CLEAR_ERR();
            return PyObject_Vectorcall(c->slow, args, nargsf, kwnames);
        }
        T->state = st;      /* the thread keeps this reference for good */
    }
    Py_INCREF(st);
    PyObject *pa = PyDict_GetItemWithError(st, s_api);
    PyObject *pd = pa != NULL ? PyDict_GetItemWithError(st, s_detail) : NULL;
    Py_XINCREF(pa);
    Py_XINCREF(pd);
    if (PyDict_SetItem(st, s_api, api) != 0 || PyDict_SetItem(st, s_detail, detail) != 0)
        CLEAR_ERR();
    PyObject *ret = PyObject_Vectorcall(c->slow, args, nargsf, kwnames);
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    CLEAR_ERR();
    PyObject *keys[2] = {s_api, s_detail}, *was[2] = {pa, pd};
    for (int i = 0; i < 2; i++) {
        if ((was[i] != NULL ? PyDict_SetItem(st, keys[i], was[i])
                            : PyDict_DelItem(st, keys[i])) != 0)
            CLEAR_ERR();
    }
    PyErr_Restore(et, ev, etb);
    Py_XDECREF(pa); Py_XDECREF(pd); Py_DECREF(st);
    return ret;
}

/* A record's kind, group, thread and call site (ctx_vectorcall's, and the recording group's
 * direct_pre): whether r holds a reference to its site (REC_OWN_SITE). */
static inline __attribute__((always_inline)) int rec_group_site(FastCtx *c, ThreadSt *T,
                                                                 Rec *r) {
    r->fact = c->fact_i;
    r->pgidx = c->last_idx;
    r->t1 = 0;
    /* this thread's ident from H while H's thread block is still T's (Python code run
     * since the entry may have let another thread in): not the TCB's line */
    r->thread = LIKELY(H.e_ts_T == T) ? H.e_thread : PyThread_get_thread_ident();
    int site_own = 1;
    r->site = H.c_stack ? call_site(c, &site_own) : NULL;
    if (r->site == NULL) {
        CLEAR_ERR();
        r->site = Py_None;
        Py_INCREF(Py_None);
        site_own = 1;
    }
    return site_own;
}

static PyObject *ctx_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    FastCtx *c = (FastCtx *)self;
    ThreadSt *T = thread_st();
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *rec = NULL, *key = NULL, *ret = NULL;
    PyObject *tkey = NULL;                  /* torch seq check (tseq_after): the group */
    long long tlo = -1;
    /* The row, its values read straight into it (no local per value: the frame a cold op
     * writes stays small). Until it is complete (`own` cleared), r.api / r.detail are
     * borrowed (the thread's state dict holds them) and r.dtype / r.dev are new references
     * where `own` says so (REC_OWN_*), else borrowed. */
    Rec r;
    r.dtype = r.dev = NULL;
    r.count = r.outb = r.step = r.peer = r.root = NONE_LL;
    char have_seq = 0;
    unsigned char own = 0;
    /* rec is a new reference (1), or borrowed from H.e_rec with H.n_busy counting it (0) */
    char rec_own = 0;
    PyObject *ov_api = NULL, *ov_detail = NULL;   /* ddp_issue's, for this call */
    if (UNLIKELY(T->ov)) {
        ov_api = T->ov_api;
        ov_detail = T->ov_detail;
        T->ov_api = T->ov_detail = NULL;
        T->ov = 0;
    }

    if (H.pf_on) {
        /* torch's tensor accessors (not called where the C++ reads read the tensor), the
         * tensor (pf_setup, above) */
        if (H.mt_tensor_meta == NULL)
            pf_accessors();
        if (c->x_i >= 0 && c->x_i < nargs)
            __builtin_prefetch(args[c->x_i]);
    }
    /* The recorder (recorder._recorder): the last answer while the module's dict is unchanged. */
    if (LIKELY(HAVE_DVER && H.e_rec_ok && c->recmod_d == H.e_recmod_d)) {
        rec = H.e_rec;   /* borrowed: H lets go of it only when no op holds it (rec_retire) */
        if (UNLIKELY(rec == Py_None || T->depth))
            return PyObject_Vectorcall(c->orig, args, nargsf, kwnames);
        H.n_busy++;
    } else {
        rec = ent_rec_refresh(c);
        if (rec == NULL)
            SLOW();
        rec_own = 1;
    }
    if (UNLIKELY(rec == Py_None || T->depth)) {
        /* Tracing off, or a call made inside a call this path is recording: not a row. */
        if (rec_own)
            Py_DECREF(rec);
        else
            rec_busy_end();
        return PyObject_Vectorcall(c->orig, args, nargsf, kwnames);
    }
    if (UNLIKELY(H.c_rec != rec) && cache_recorder(c, rec) != 0)
        SLOW();
    if (UNLIKELY(!H.c_now_ok))
        SLOW();   /* injected clock skew (tests), a custom clock */
    /* This thread's state (wrappers.tls.__dict__): nested call, coalescing manager,
     * object-collective accumulation go to Python; the api / detail overrides of rows issued
     * in this context come from the same dict. */
    {
        PyObject *st = T->state;
        if (LIKELY(HAVE_DVER && st != NULL && T->st_d == st && DVER(st) == T->st_v)) {
            r.api = T->api;
            r.detail = T->detail;
        } else if (ent_thread_refresh(c, T, &r.api, &r.detail) != 0) {
            SLOW();
        }
        if (UNLIKELY(ov_api != NULL)) {
            r.api = ov_api;
            r.detail = ov_detail;
        }
    }
    /* NVTX ranges (nvtx_ranges.active): checked again only when its module's dict changed. */
    if (UNLIKELY(!(HAVE_DVER && H.e_nvtx_ok && c->nvtx_d == H.e_nvtx_d)) &&
            ent_nvtx_refresh(c) != 0)
        SLOW();
    /* The device timer (must be None here) and the step: from the recorder's __dict__. */
    {
        PyObject *rd = H.c_rdict;
        /* (e_rd_ok: read from this c_rec; cache_recorder clears it. 1: told of changes,
         * 2: valid while c_rdict's tag is e_rdict_v) */
        if (LIKELY((H.e_rd_ok & 3) == 1) ||
                (HAVE_DVER && (H.e_rd_ok & 3) == 2 && DVER(rd) == H.e_rdict_v))
            r.step = H.e_step;
        else if (ent_rd_refresh(rec, &r.step) != 0)
            SLOW();
    }
    r.t0 = now_ns();

    /* Group -> PgInfo (cached by the Python side on first sight). */
    {
        PyObject *g = slot_k(c, args, nargs, kwnames, SL_G, c->g_i, c->g_n, c->g_d);
        if (g == Py_None) {
            key = fast_attr(c->world_d, c->world, s_default_pg);   /* new reference */
            if (key == NULL)
                SLOW();
        } else {
            key = g;   /* the caller holds it for the call */
            Py_INCREF(key);
        }
        if (UNLIKELY(key != c->last_key || c->last_gen != H.pg_gen) && group_refresh(c, key) != 0)
            SLOW();   /* not a member, or first sight: the Python path */
        Py_CLEAR(key);
    }
    int is_async = 0;
    PyObject *x_arg = NULL, *y_arg = NULL;   /* borrowed: the tensors (hazard detection) */
    if (UNLIKELY(c->always_async)) {
        /* isend / irecv: recorded here when the recorder allows the async path */
        if (!as_usable(rec))
            SLOW();
        is_async = 1;
    }
    if (c->a_n != Py_None) {
        PyObject *a = slot_k(c, args, nargs, kwnames, SL_A, c->a_i, c->a_n, c->a_d);
        int t = a == Py_False || a == Py_None ? 0 : PyObject_IsTrue(a);
        if (UNLIKELY(t != 0)) {
            /* async_op=True: recorded here too (as_issue) when the recorder allows it */
            if (t != 1 || !as_usable(rec))
                SLOW();
            is_async = 1;
        }
    }
    /* The tensor: count, dtype, device (bytes = count * itemsize, in the writer). */
    {
        PyObject *x = slot_k(c, args, nargs, kwnames, SL_X, c->x_i, c->x_n, c->x_d);
        x_arg = x;
        if (x == Py_None)
            SLOW();
        long long dev_v;
        if (LIKELY(H.mt_tensor_meta != NULL) && exact_tensor(x) &&
                H.mt_tensor_meta(x, &r.count, &r.dtype, &dev_v) == 1) {
            /* dtype and dev borrowed (kept: the record holds them so, no refcount writes) */
            c->n_meta_t++;
            if (UNLIKELY(r.dtype != c->last_dtype) && keep_dtype(c, r.dtype) != 0)
                SLOW();
            if (LIKELY(c->last_dev != NULL && c->last_dev_v == dev_v)) {
                r.dev = c->last_dev;
            } else if ((r.dev = dev_name(c, dev_v)) == NULL) {
                SLOW();   /* first tensor on this device: the Python path names it */
            }
        } else {
            own = REC_OWN_DTYPE | REC_OWN_DEV;   /* new references */
            if (tensor_facts_rec(c, x, &r) != 0)
                SLOW();
        }
        if (c->has_y) {
            PyObject *y = slot_k(c, args, nargs, kwnames, SL_Y, c->y_i, c->y_n, c->y_d);
            if (y == Py_None)
                SLOW();
            y_arg = y;
            if (!(exact_tensor(y) && H.mt_tensor_nbytes != NULL &&
                  H.mt_tensor_nbytes(y, &r.outb) == 1) && outb_py(y, &r) != 0)
                SLOW();
        }
    }
    /* a device-timed op (the C device timer, a CUDA tensor): blocking ones are timed here,
     * async ones by the Python path (their wait events) */
    int timed = UNLIKELY(H.e_rd_ok & RD_DT) && e_dt != NULL && dt_timed(r.dev);
    if (UNLIKELY(timed && is_async))
        SLOW();
    if (UNLIKELY(c->last_name == NULL))
        SLOW();   /* the groups were forgotten since the lookup above (invalidate) */
    if (c->has_peer || c->has_root) {
        if (peer_root_rec(c, args, nargs, kwnames, &r, &have_seq) != 0)
            SLOW();
    }
    if (!c->has_peer) {
        Py_ssize_t sl = c->last_slot;
        long long v;
        if (LIKELY(sl >= 0 && sl < H.c_seq_n)) {
            r.seq = H.c_seq_v[2 * sl]++;   /* counters_next, from H's copy of the array */
            have_seq = 1;
        } else if (LIKELY(H.c_counters != NULL && sl >= 0) &&
                (v = counters_next((Counters *)H.c_counters, sl)) >= 0) {
            r.seq = v;   /* taken (no int object) */
            have_seq = 1;
        } else if (H.c_seq != NULL && seq_dict_rec(c, &r) == 0) {
            have_seq = 1;
        }
    }
    if (!have_seq)
        SLOW();   /* nothing counted yet: the Python path counts it */
    /* From here on the seq is taken: never fall back to the Python path (it would count the
     * call again). A failure of commtrace's own bookkeeping drops the row, not the call. */
    {
        int site_own = rec_group_site(c, T, &r);
        r.op_id = LIKELY(H.c_op_c) ? H.c_op_next++   /* the OpIds' value, held in H (opids_attach) */
                                   : op_id_iter();
        /* the row takes site, dtype and dev (their references where owned) */
        r.own = own | (site_own ? REC_OWN_SITE : 0);
        own = 0;   /* r is complete: it holds what it owns */
        Py_INCREF(r.api);
        Py_INCREF(r.detail);
        CLEAR_ERR();
        c->n_fast++;
        long long t_opid = r.op_id, t_seq = r.seq;
        Py_ssize_t tslot = -1;
        if (H.ts_gap != NULL && c->last_tseq && c->last_key != NULL) {
            tkey = c->last_key; Py_INCREF(tkey);
            tslot = c->last_slot;
            /* A point-to-point op reads the number before the call too, unless its group
             * numbers each one (gloo: PgInfo.p2p_one), which then claims (hi - 1, hi] as a
             * collective does, with one read (at its wait, or after an async issue). */
            if (c->has_peer && !c->last_p2p1 && (tlo = tseq_read(tkey)) < 0)
                Py_CLEAR(tkey);   /* unreadable: no check */
        }
        if (UNLIKELY(is_async)) {
            /* An async op: its own path (the row, the pending-op registry, the completion). */
            PyObject *tname = tkey != NULL ? c->last_name : NULL;
            Py_XINCREF(tname);
            TseqArgs ts = {tkey, tname, tslot, tlo, t_opid, t_seq};
            ret = as_issue(c, rec, &r, x_arg, y_arg, args, nargsf, kwnames, &ts);
            Py_XDECREF(tname);
            goto done;
        }
        /* In flight while the call runs (_inflight.json, final flush): a slot of its own. */
        int slot_i = -1;
        if (LIKELY(~H.inprog_used != 0)) {
            slot_i = __builtin_ctzll(~H.inprog_used);
            H.inprog_used |= 1ULL << slot_i;
            H.inprog_taken &= ~(1ULL << slot_i);
            *inprog_ref(slot_i) = &r;   /* r stays here until the slot is freed */
        }
        /* Inner wrapped calls are not rows of their own: C wrappers read tl.depth, the
         * Python ones ask depth() (the same rule as tls.depth on the Python path). */
        T->depth = 1;
        T->blk_wait = 1;
        /* A plain collective's number is read at its wait() (tl.tseq_g, above tseq_after), and
         * so is a point-to-point op's on a group that numbers each (p2p_one). */
        T->tseq_hi = -1;
        T->tseq_g = tkey != NULL && (!c->has_peer || c->last_p2p1) && H.ts_at_wait ? tkey : NULL;
        /* the device timer's start event (a C call: no Python frame) */
        PyObject *dt = NULL, *dtok = NULL;
        if (UNLIKELY(timed)) {
            dt = e_dt;
            Py_INCREF(dt);
            dtok = dt_api->on_issue(dt, r.op_id);
            CLEAR_ERR();
        }
        /* The user's call. */
        ret = PyObject_Vectorcall(c->orig, args, nargsf, kwnames);
        long long t1 = now_ns();
        T->depth = 0;
        T->blk_wait = 0;
        T->tseq_g = NULL;
        long long thi = T->tseq_hi;
        T->tseq_hi = -1;
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        int taken = slot_i >= 0 && ((H.inprog_taken >> slot_i) & 1);
        r.t1 = t1;
        int held = 0;
        if (UNLIKELY(dtok != NULL)) {
            if (ret != NULL && !taken) {
                dt_api->on_return(dt, dtok, 1);   /* its end event, on the current stream */
                held = 1;
            } else {
                dt_api->abandon(dt, dtok);
            }
            CLEAR_ERR();
            Py_DECREF(dtok);
        }
        Py_XDECREF(dt);
        if (UNLIKELY(taken)) {
            inprog_free(slot_i);
            rec_release(&r);   /* a final flush wrote it as never completed */
        } else if (UNLIKELY(ret == NULL)) {
            inprog_free(slot_i);
            blk_error(c, rec, &r, t1, &et, &ev, &etb);
            if (tkey != NULL)   /* a call that raised may still have issued its number */
                tseq_after(c, rec, tkey, tslot, NULL, tlo, t_opid, t_seq, -1);
        } else {
            if (LIKELY(!held) || dt_hold(&r) != 0)
                buf_push(&r);  /* takes the references, or releases them when full */
            inprog_free(slot_i);
            if (tkey != NULL)
                tseq_after(c, rec, tkey, tslot, NULL, tlo, t_opid, t_seq, thi);
        }
        CLEAR_ERR();   /* commtrace's own errors never reach the user */
        PyErr_Restore(et, ev, etb);
    }
    goto done;

slow:
    CLEAR_ERR();
    n_slow++;
    if (UNLIKELY(ov_api != NULL))
        ret = ov_slow(c, T, ov_api, ov_detail, args, nargsf, kwnames);
    else
        ret = PyObject_Vectorcall(c->slow, args, nargsf, kwnames);
done:
    if (own & REC_OWN_DTYPE)
        Py_XDECREF(r.dtype);
    if (own & REC_OWN_DEV)
        Py_XDECREF(r.dev);
    if (rec_own)
        Py_XDECREF(rec);
    else if (rec != NULL)
        rec_busy_end();
    Py_XDECREF(key); Py_XDECREF(tkey);
    return ret;
}

/* make_ctx(orig, slow, on_error, recmod, tls, pg_cache, world, nvtx, time_ns, code_internal,
 *          site_pairs, site_of_frame, dev_names, fact, slots: dict, flags: dict) */
static PyObject *make_ctx(PyObject *module, PyObject *args) {
    FastCtx *c = ctx_new();
    if (c == NULL)
        return NULL;
    c->vectorcall = ctx_vectorcall;
    ctx_register(c);
    PyObject *slots, *flags;
    if (!PyArg_ParseTuple(args, "OOOOOO!OOOO!O!OO!OO!O!", &c->orig, &c->slow, &c->on_error,
                          &c->recmod, &c->tls, &PyDict_Type, &c->pg_cache, &c->world,
                          &c->nvtx, &c->time_ns, &PyDict_Type, &c->code_internal,
                          &PyDict_Type, &c->site_pairs, &c->site_of_frame, &PyDict_Type,
                          &c->dev_names, &c->fact, &PyDict_Type, &slots, &PyDict_Type,
                          &flags)) {
        void *raw = c->raw;
        memset(((char *)c) + sizeof(PyObject), 0, sizeof(FastCtx) - sizeof(PyObject));
        c->raw = raw;
        Py_DECREF(c);
        return NULL;
    }
    Py_INCREF(c->orig); Py_INCREF(c->slow); Py_INCREF(c->on_error); Py_INCREF(c->recmod);
    Py_INCREF(c->tls); Py_INCREF(c->pg_cache); Py_INCREF(c->world); Py_INCREF(c->nvtx);
    Py_INCREF(c->time_ns); Py_INCREF(c->code_internal); Py_INCREF(c->site_pairs);
    Py_INCREF(c->site_of_frame); Py_INCREF(c->dev_names); Py_INCREF(c->fact);
    c->fact_i = (int)PyLong_AsLong(c->fact);
    if (c->fact_i < 0 || c->fact_i > SHRT_MAX) {   /* Rec.fact: an index in FAST_SPECS */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "fact: an index in FAST_SPECS");
        Py_DECREF(c);
        return NULL;
    }
    c->recmod_d = dict_of(c->recmod);
    c->nvtx_d = dict_of(c->nvtx);
    c->world_d = dict_of(c->world);
    struct { const char *k; int *i; PyObject **n, **d; } sl[] = {
        {"group", &c->g_i, &c->g_n, &c->g_d}, {"x", &c->x_i, &c->x_n, &c->x_d},
        {"y", &c->y_i, &c->y_n, &c->y_d}, {"async", &c->a_i, &c->a_n, &c->a_d},
        {"r0", &c->r0_i, &c->r0_n, &c->r0_d}, {"r1", &c->r1_i, &c->r1_n, &c->r1_d},
    };
    for (size_t j = 0; j < sizeof(sl) / sizeof(sl[0]); j++) {
        PyObject *v = PyDict_GetItemString(slots, sl[j].k);  /* (i, name, default) */
        if (v == NULL || !PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 3) {
            PyErr_Format(PyExc_ValueError, "slot %s: (position, name, default)", sl[j].k);
            Py_DECREF(c);
            return NULL;
        }
        *sl[j].i = (int)PyLong_AsLong(PyTuple_GET_ITEM(v, 0));
        *sl[j].n = PyTuple_GET_ITEM(v, 1);
        *sl[j].d = PyTuple_GET_ITEM(v, 2);
        Py_INCREF(*sl[j].n);
        if (PyUnicode_CheckExact(*sl[j].n))
            PyUnicode_InternInPlace(sl[j].n);   /* slot(): found by identity */
        Py_INCREF(*sl[j].d);
    }
    struct { const char *k; char *v; } fl[] = {
        {"has_y", &c->has_y}, {"has_root", &c->has_root}, {"has_peer", &c->has_peer},
        {"is_send", &c->is_send}, {"always_async", &c->always_async},
    };
    for (size_t j = 0; j < sizeof(fl) / sizeof(fl[0]); j++) {
        PyObject *v = PyDict_GetItemString(flags, fl[j].k);
        *fl[j].v = v != NULL && PyObject_IsTrue(v) == 1;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

static PyObject *counts(PyObject *module, PyObject *unused) {
    unsigned long long f = n_dead_fast;
    for (Py_ssize_t i = 0; i < n_ctxs; i++)
        f += ctxs[i]->n_fast;
    return Py_BuildValue("(KKi)", f, n_slow, last_slow_line);
}


/* ---------------------------------------------------------------------------------------
 * Work.wait: torch's blocking collectives call work.wait() themselves. With no async op in
 * flight (rec._by_key empty) there is nothing to record: call the original at once;
 * otherwise the Python wrapper (`slow`) records the wait.
 * ------------------------------------------------------------------------------------- */

static PyObject *wait_other(WaitW *w, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames);

static PyObject *wait_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    WaitW *w = (WaitW *)self;
    ThreadSt *T = thread_st();
    if (T->tseq_g != NULL) {
        /* the wait of a blocking call being recorded: its torch seq, read while warm */
        PyObject *g = T->tseq_g;
        T->tseq_g = NULL;
        T->tseq_hi = tseq_read(g);
    }
    if (LIKELY(T->blk_wait)) {
        /* The first wait inside a blocking call this path records is that call's own Work,
         * made inside it: not an op commtrace tracks (inner calls are not rows), so the
         * Python wait would find nothing to do. No recorder or pending-op lookups. */
        T->blk_wait = 0;
        return PyObject_Vectorcall(w->orig, args, nargsf, kwnames);
    }
    return wait_other(w, args, nargsf, kwnames);
}

/* Any other wait: an async op's (as_wait), or one with nothing pending (the original). */
static NOINLINE PyObject *wait_other(WaitW *w, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    PyObject *rec = fast_attr(w->recmod_d, w->recmod, s_recorder);
    if (rec == NULL) {
        CLEAR_ERR();
        return PyObject_Vectorcall(w->slow, args, nargsf, kwnames);
    }
    int idle = rec == Py_None;
    if (!idle) {
        PyObject *bk = fast_attr(rec == H.c_rec ? H.c_rdict : NULL, rec, s_by_key);
        idle = bk != NULL && PyDict_Check(bk) && PyDict_GET_SIZE(bk) == 0;
        Py_XDECREF(bk);
        CLEAR_ERR();
    }
    if (!idle && as_on) {
        int handled = 0;
        PyObject *res = as_wait(w, rec, args, nargsf, kwnames, &handled);
        if (handled) {
            Py_DECREF(rec);
            return res;
        }
        CLEAR_ERR();
    }
    Py_DECREF(rec);
    return PyObject_Vectorcall(idle ? w->orig : w->slow, args, nargsf, kwnames);
}

static PyObject *wait_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static void wait_dealloc(WaitW *w) {
    Py_CLEAR(w->dict); Py_CLEAR(w->orig); Py_CLEAR(w->slow); Py_CLEAR(w->recmod);
    Py_CLEAR(w->recmod_d);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* A wrapper that stands in for a method on a class (Work.wait, Tensor.item): called unbound
 * with the instance first, bound like a function when read from an instance. */
#define METHOD_WRAPPER_TYPE(T, dealloc, name, doc) {                                         \
    PyVarObject_HEAD_INIT(NULL, 0)                                                          \
    .tp_name = name,                                                                        \
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR, \
    WRAPPER_SLOTS(T, dealloc), .tp_descr_get = wait_descr_get, .tp_doc = doc }

static PyTypeObject WaitType = METHOD_WRAPPER_TYPE(
    WaitW, wait_dealloc, "commtrace.capture._fastpath.WaitWrapper",
    "Work.wait recorded by commtrace (see __wrapped__).");

/* A new wrapper object of `type` (a WaitW or an AroundW: vectorcall, dict, then `n` object
 * members from the one at `first`), those members being the `n` arguments in `args`. */
static PyObject *new_wrapper(PyTypeObject *type, vectorcallfunc vc, PyObject *args,
                             size_t first, Py_ssize_t n) {
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != n) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", type->tp_name, n);
        return NULL;
    }
    PyObject *o = PyObject_New(PyObject, type);
    if (o == NULL)
        return NULL;
    WaitW *head = (WaitW *)o;   /* the members every wrapper starts with */
    head->vectorcall = vc;
    head->dict = NULL;
    PyObject **m = (PyObject **)((char *)o + first);
    for (Py_ssize_t i = 0; i < n; i++) {
        m[i] = PyTuple_GET_ITEM(args, i);
        Py_INCREF(m[i]);
    }
    return o;
}

/* make_wait(orig_wait, python_wait, recorder_module) */
static PyObject *make_wait(PyObject *module, PyObject *args) {
    WaitW *w = (WaitW *)new_wrapper(&WaitType, wait_vectorcall, args, offsetof(WaitW, orig), 3);
    if (w != NULL)
        w->recmod_d = dict_of(w->recmod);
    return (PyObject *)w;
}

/* around(orig, before, after): a wrapper whose call of torch's function runs from C, so that a
 * warning torch raises inside with `stacklevel` points at the user's line, not at commtrace's
 * (a Python wrapper is one frame more). before(*args, **kwargs) -> token or None (None: just
 * call orig); after(token, result, exception) runs once orig returned or raised. Neither may
 * raise into the user's code: an error of theirs is cleared. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *orig, *before, *after;
} AroundW;

static PyObject *around_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    AroundW *a = (AroundW *)self;
    PyObject *tok = PyObject_Vectorcall(a->before, args, nargsf, kwnames);
    if (tok == NULL) {
        PyErr_Clear();
        return PyObject_Vectorcall(a->orig, args, nargsf, kwnames);
    }
    if (tok == Py_None) {
        Py_DECREF(tok);
        return PyObject_Vectorcall(a->orig, args, nargsf, kwnames);
    }
    PyObject *ret = PyObject_Vectorcall(a->orig, args, nargsf, kwnames);
    if (ret == NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        PyObject *r = PyObject_CallFunctionObjArgs(a->after, tok, Py_None,
                                                   ev ? ev : Py_None, NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        Py_DECREF(tok);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(a->after, tok, ret, Py_None, NULL);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_DECREF(tok);
    return ret;
}

static void around_dealloc(AroundW *a) {
    Py_CLEAR(a->dict); Py_CLEAR(a->orig); Py_CLEAR(a->before); Py_CLEAR(a->after);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyTypeObject AroundType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "commtrace.capture._fastpath.AroundWrapper",
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    WRAPPER_SLOTS(AroundW, around_dealloc),
    .tp_doc = "A function recorded by commtrace around its call (see __wrapped__).",
};

static PyObject *around(PyObject *module, PyObject *args) {
    return new_wrapper(&AroundType, around_vectorcall, args, offsetof(AroundW, orig), 3);
}

/* instancemethod(callable) -> the object pybind11 puts on a class for a C++ method (what
 * torch's own Work.wait is). Dynamo recognises it as a method of a C++ class, exactly as it
 * does torch's: a Work.wait replaced by one stays out of compiled graphs the same way. */
static PyObject *instancemethod(PyObject *module, PyObject *fn) {
    return PyInstanceMethod_New(fn);
}

/* depth() -> 1 while this thread is inside a call the C path is recording, else 0. */
static PyObject *depth(PyObject *module, PyObject *unused) {
    return PyBool_FromLong(tl.depth);
}

/* entry_changed(): recorder._recorder, nvtx_ranges.active, or a recorder's step or
 * device_timer (the properties rd_props) was assigned: their dicts' tags are not read per op
 * (H.e_rec_ok, H.e_nvtx_ok, H.e_rd_ok). */
static PyObject *entry_changed(PyObject *module, PyObject *unused) {
    H.e_rec_ok = H.e_nvtx_ok = H.e_rd_ok = 0;
    H.rd_epoch++;
    Py_RETURN_NONE;
}

/* rd_changed(): a recorder's step or device_timer was assigned (their setters): only the
 * recorder's values are read again, not recorder._recorder or nvtx_ranges.active (a step
 * changes once per training step). */
static PyObject *rd_changed(PyObject *module, PyObject *unused) {
    H.e_rd_ok = 0;
    H.rd_epoch++;
    Py_RETURN_NONE;
}

/* rd_props(step, device_timer): recorder.Recorder's two properties whose setters call
 * rd_changed() (strong, for the module's life). */
static PyObject *rd_props_set(PyObject *module, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b))
        return NULL;
    Py_INCREF(a);
    Py_INCREF(b);
    Py_XSETREF(rd_props[0], a);
    Py_XSETREF(rd_props[1], b);
    H.c_rd_notify = 0;   /* decided at the next recorder cached (cache_recorder) */
    H.e_rd_ok = 0;
    Py_RETURN_NONE;
}

static PyObject *invalidate(PyObject *module, PyObject *unused) {
    H.pg_gen++;
    H.e_rec_ok = H.e_nvtx_ok = H.e_rd_ok = 0;
    for (Py_ssize_t i = 0; i < n_ctxs; i++) {
        FastCtx *c = ctxs[i];
        Py_CLEAR(c->last_key); Py_CLEAR(c->last_name); Py_CLEAR(c->last_info);
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------
 * SIGUSR1 for the hang watchdog: the handler only counts the signal (async-signal-safe) and
 * chains to the handler it replaced; the watchdog thread sees the count change and dumps every
 * thread's stack itself, holding the GIL. faulthandler.register() dumps from inside the signal
 * handler, reading the frames of threads that may be running at that moment, and can crash the
 * process that way (CPython gh-116008; seen once here on a rank blocked in gloo).
 * ------------------------------------------------------------------------------------- */
#if defined(SIGUSR1) && !defined(_WIN32)
#include <errno.h>
static volatile sig_atomic_t usr1_n;
static struct sigaction usr1_prev;
static int usr1_on;

static void usr1_handler(int sig, siginfo_t *si, void *uc) {
    int saved = errno;
    usr1_n++;
    if (usr1_prev.sa_flags & SA_SIGINFO) {
        if (usr1_prev.sa_sigaction != NULL)
            usr1_prev.sa_sigaction(sig, si, uc);
    } else if (usr1_prev.sa_handler != SIG_DFL && usr1_prev.sa_handler != SIG_IGN &&
               usr1_prev.sa_handler != NULL) {
        usr1_prev.sa_handler(sig);   /* e.g. Python's own, for a handler set with signal.signal */
    }
    errno = saved;
}

static PyObject *usr1_install(PyObject *module, PyObject *unused) {
    if (!usr1_on) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = usr1_handler;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGUSR1, &sa, &usr1_prev) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        usr1_on = 1;
    }
    return PyLong_FromLong((long)usr1_n);
}

static PyObject *usr1_uninstall(PyObject *module, PyObject *unused) {
    if (usr1_on) {
        struct sigaction cur;
        /* Restore the previous handler only if ours is still the one installed. */
        if (sigaction(SIGUSR1, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
            cur.sa_sigaction == usr1_handler)
            sigaction(SIGUSR1, &usr1_prev, NULL);
        usr1_on = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *usr1_count(PyObject *module, PyObject *unused) {
    return PyLong_FromLong((long)usr1_n);
}
#endif

/* ---------------------------------------------------------------------------------------
 * DDP's comm hook in C (issue 20; commtrace/capture/ddp.py, which registers it).
 *
 * Without a comm hook of the user's, commtrace registers one hook on a DDP model to see its
 * gradient all-reduces. In Python that hook is a frame per bucket (the dispatcher, torch's
 * allreduce_hook, torch's all_reduce, commtrace's wrapper) and two callbacks per bucket on the
 * backend's thread, each taking the GIL: commtrace's completion stamp and allreduce_hook's
 * `.then(lambda fut: fut.value()[0])`. ddp_hook does the same work from C, for the common
 * case (a CPU bucket of a real floating dtype, tracing on, no hook of the user's, the async C
 * path usable); anything else goes to the Python dispatcher (ddp._dispatch), unchanged:
 *   - the bucket is scaled as DDP's Reducer scales gradients without a hook (ddp.py
 *     _HookState.scale: `mul_(1 / world size)` as its copy into the bucket does, or `div_`
 *     for a model whose gradients are views of the bucket);
 *   - its all_reduce is recorded by a FastCtx of commtrace's all_reduce wrapper (the same
 *     row, seq, site, torch-seq claim, pending op and in-flight listing as any async
 *     all_reduce), with tls api/detail set as the dispatcher sets them; that ctx calls
 *     ddp_allreduce (ProcessGroup.allreduce with the options torch's all_reduce builds) instead
 *     of torch's Python all_reduce;
 *   - DDP needs a Future whose value is the bucket as a Python object (PythonCommHook::
 *     parseHookResult asserts a PyObject), which `.then` gives: the continuation (ddp_then)
 *     is a C object that also stamps the op's completion (what DoneCB does), so one callback
 *     per bucket takes the GIL on the backend's thread. An error of the all_reduce reaches DDP as it does
 *     through allreduce_hook: value() raises in the continuation, the Future carries it.
 * ------------------------------------------------------------------------------------- */
static struct {
    PyObject *fallback;    /* ddp._dispatch(state, bucket) */
    PyObject *ctx;         /* FastCtx of all_reduce calling ddp_allreduce */
    PyObject *recmod, *recmod_d;
    PyObject *tls;         /* wrappers.tls */
    PyObject *details;     /* ddp._bucket_detail: bucket index -> detail text */
    PyObject *detail_of;   /* ddp._detail_of(bucket) */
    PyObject *dtypes;      /* dtypes whose buckets are taken here (a frozenset) */
    PyObject *op_sum;      /* ReduceOp.SUM */
    PyObject *opts;        /* AllreduceOptions: reduceOp SUM, asyncOp True */
    PyObject *coalesce;    /* torch's _world.pg_coalesce_state (a dict) */
    PyObject *orig;        /* torch's all_reduce, for any other call of ddp_allreduce */
    PyObject *api;         /* "ddp_comm_hook" */
    int on;
} dh;
static unsigned long long n_ddp, n_ddp_fallback;

/* The C++ hook's "interface v2" (commtrace/capture/_ddp_hook.cpp): for a bucket this path
 * takes, the C++ side scales the bucket and issues its all_reduce through c10d's C++ API, as
 * torch's builtin C++ hooks do, instead of the Python method call and the pybind call of
 * ProcessGroup.allreduce. The recording is this path's, unchanged: ddp_allreduce, called by
 * all_reduce's FastCtx between the enqueue and return stamps, hands the call to issue_ar.
 * Both take the GIL held; ctx is the C++ side's. */
typedef struct DdpIssuer {
    PyObject *group;   /* the Python group the C++ side issues on (borrowed): others go to pybind */
    void *ctx;
    /* buf.div_(i) (div) or buf.mul_(f): 0, or -1 with a Python exception set */
    int (*scale)(void *ctx, int div, double f, long long i);
    /* group.allreduce([buf], SUM, async) in C++: the Work as a Python object (a new
     * reference), or NULL with a Python exception set */
    PyObject *(*issue_ar)(void *ctx);
    /* the same, the Work kept by the C++ side (no Python object): 0, or -1 with a Python
     * exception set (as_issue's t_as_nopy) */
    int (*issue_ar_nopy)(void *ctx);
} DdpIssuer;
static _Thread_local DdpIssuer *t_ddp_iss;   /* set while ddp_issue runs all_reduce's ctx */
static _Thread_local PyObject *t_ddp_iss_buf;
static PyObject *s_mul_, *s_div_;
static PyObject *s_user_hook, *s_scale, *s_buffer, *s_index, *s_allreduce, *s_then, *s_value;

/* The continuation of one bucket's all_reduce (the `.then` callback of its Work's future): a
 * DoneCB (done_new) whose row, if any, it stamps once, then the bucket's value. */
static PyObject *ddp_then_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    long long t = now_ns();
    DoneCB *d = (DoneCB *)self;
    if (PyVectorcall_NARGS(nargsf) != 1) {
        PyErr_SetString(PyExc_TypeError, "ddp_then(future)");
        return NULL;
    }
    if (d->row != NULL) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        done_stamp(d, t);
        Py_CLEAR(d->row);
        CLEAR_ERR();
        PyErr_Restore(et, ev, etb);
    }
    /* fut.value()[0], as allreduce_hook's lambda: raises the all_reduce's error, if any. (The
     * op stays pending until the writer thread releases it, as DoneCB's: releasing it here
     * empties the pending set after every bucket, and each 0 <-> 1 change calls the hazard
     * listener, a Python function, twice per bucket: +25 us per bucket at world size 1.) */
    PyObject *v = PyObject_CallMethodNoArgs(args[0], s_value);
    if (v == NULL)
        return NULL;
    PyObject *x = PySequence_GetItem(v, 0);
    Py_DECREF(v);
    return x;
}

/* ddp_allreduce(tensor, op, group, async_op): what torch's all_reduce does for the hook's
 * call (a dense real tensor, ReduceOp.SUM, a group this rank is a member of, async, not in a
 * coalescing block): group.allreduce([tensor], opts). Any other call goes to torch's. */
static PyObject *ddp_allreduce(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 4 && dh.on && args[1] == dh.op_sum && args[2] != Py_None &&
        args[3] == Py_True && PyDict_Check(dh.coalesce) && PyDict_GET_SIZE(dh.coalesce) == 0) {
        DdpIssuer *iss = t_ddp_iss;
        if (iss != NULL && args[2] == iss->group && args[0] == t_ddp_iss_buf) {
            t_ddp_iss = NULL;   /* once */
            if (t_as_nopy && iss->issue_ar_nopy != NULL) {
                t_as_nopy = 0;
                if (iss->issue_ar_nopy(iss->ctx) < 0)
                    return NULL;
                Py_INCREF(as_cxx_work);
                return as_cxx_work;
            }
            return iss->issue_ar(iss->ctx);
        }
        PyObject *lst = PyList_New(1);
        if (lst == NULL)
            return NULL;
        Py_INCREF(args[0]);
        PyList_SET_ITEM(lst, 0, args[0]);
        PyObject *av[3] = {args[2], lst, dh.opts};
        PyObject *w = PyObject_VectorcallMethod(s_allreduce, av,
                                                3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(lst);
        return w;
    }
    if (dh.orig == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ddp_allreduce: not set up");
        return NULL;
    }
    return PyObject_Vectorcall(dh.orig, args, nargs, NULL);
}

static int is_str(PyObject *x, PyObject *interned) {
    return x == interned || (PyUnicode_CheckExact(x) && PyUnicode_Compare(x, interned) == 0);
}

static PyObject *ddp_fallback(PyObject *state, PyObject *bucket) {
    n_ddp_fallback++;
    PyObject *av[2] = {state, bucket};
    return PyObject_Vectorcall(dh.fallback, av, 2, NULL);
}

/* ddp_issue: the C path's work for one bucket (ddp_hook's, and the C++ hook's through
 * ddp_cxx_api): buf and idx are the bucket's buffer and index, detail_arg what ddp._detail_of
 * takes when the index has no detail text yet. Returns 0 when the bucket is not this path's
 * (nothing done, no error set: the Python dispatcher takes it), -1 with an exception set when
 * the scaling or the all_reduce failed (DDP sees the error, as through allreduce_hook), 1 when
 * issued: *work is the Work (a new reference); *row and *fut are the op's row and its Work's
 * future as the async path handed them over (new references, or NULL: the stamp is someone
 * else's). iss: the C++ hook's scaling and all_reduce (DdpIssuer), or NULL; nofut: the caller
 * takes the Work's future itself (the C++ hook: *fut stays NULL, no Python future is made). */
/* Whether a model's hook state (ddp._HookState) has no hook of the user's (its user_hook is
 * None): 1, else 0 (no error left set). */
static int no_user_hook(PyObject *state) {
    PyObject *uh = PyObject_GetAttr(state, s_user_hook);
    int none = uh == Py_None;
    Py_XDECREF(uh);
    CLEAR_ERR();
    return none;
}

static int ddp_issue(PyObject *state, PyObject *buf, PyObject *idx, PyObject *detail_arg,
                     DdpIssuer *iss, int nofut, PyObject **work_out, PyObject **row_out,
                     PyObject **fut_out, void **dr_out) {
    *work_out = *row_out = *fut_out = NULL;
    if (dr_out != NULL)
        *dr_out = NULL;
    if (!dh.on)
        return 0;
    PyObject *rec = NULL, *scale = NULL, *detail = NULL, *work = NULL;
    DdpTake take = {NULL, NULL, 0, 0, NULL};
    int res = 0;
    rec = fast_attr(dh.recmod_d, dh.recmod, s_recorder);
    if (rec == NULL || rec == Py_None || tl.depth)
        goto out;
    if (!no_user_hook(state))
        goto out;
    /* (method name, factor, group): None when this model's buckets are not for this path */
    scale = PyObject_GetAttr(state, s_scale);
    if (scale == NULL || !PyTuple_Check(scale) || PyTuple_GET_SIZE(scale) != 3)
        goto out;
    if (buf == NULL || !exact_tensor(buf))
        goto out;
    {
        /* the device and dtype: through torch's C++ API where built (a plain read: the
         * accessors' answer), else the accessors */
        long long n_v, d = 0;
        PyObject *dt = NULL;
        if (H.mt_tensor_meta != NULL && H.mt_tensor_meta(buf, &n_v, &dt, &d) == 1) {
            Py_INCREF(dt);   /* borrowed from torch's dtype objects */
        } else {
            PyObject *dev = PyObject_Vectorcall(t_getdev, &buf, 1, NULL);
            d = dev != NULL && PyLong_Check(dev) ? PyLong_AsLong(dev) : 0;
            Py_XDECREF(dev);
            dt = d != -1 ? NULL :
                 Py_TYPE(t_dtype)->tp_descr_get(t_dtype, buf, (PyObject *)Py_TYPE(buf));
        }
        if (d != -1) {
            Py_XDECREF(dt);
            goto out;   /* not a CPU tensor: the device timer, CUDA streams: Python */
        }
        int ok = dt != NULL && PySet_Contains(dh.dtypes, dt) == 1;
        Py_XDECREF(dt);
        if (!ok)
            goto out;
    }
    detail = idx != NULL ? PyDict_GetItemWithError(dh.details, idx) : NULL;
    if (detail != NULL) {
        Py_INCREF(detail);
    } else {
        CLEAR_ERR();
        detail = PyObject_CallOneArg(dh.detail_of, detail_arg);
        if (detail == NULL)
            goto out;
    }
    /* From here on the bucket is this path's: DDP's numerics first (as allreduce_hook, the
     * division before the all_reduce) */
    res = -1;
    {
        /* the C++ hook scales in C++: mul_ by a float, as ddp._scale_of gives (div_ by an int
         * is taken too, though ddp.py hands its divisions to the Python hook since session 13:
         * _route), as the Python call passes them; anything else by the method call */
        PyObject *meth = PyTuple_GET_ITEM(scale, 0), *f = PyTuple_GET_ITEM(scale, 1);
        int done = 0;
        if (iss != NULL && is_str(meth, s_mul_) && PyFloat_CheckExact(f)) {
            if (iss->scale(iss->ctx, 0, PyFloat_AS_DOUBLE(f), 0) < 0)
                goto out;
            done = 1;
        } else if (iss != NULL && is_str(meth, s_div_) && PyLong_CheckExact(f)) {
            int ovf = 0;
            long long i = PyLong_AsLongLongAndOverflow(f, &ovf);
            if (!ovf && !(i == -1 && PyErr_Occurred())) {
                if (iss->scale(iss->ctx, 1, 0.0, i) < 0)
                    goto out;
                done = 1;
            }
            CLEAR_ERR();
        }
        if (!done) {
            PyObject *av[2] = {buf, f};
            PyObject *r = PyObject_VectorcallMethod(meth, av,
                                                    2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (r == NULL)
                goto out;
            Py_DECREF(r);
        }
    }
    {
        /* the row's api and detail: handed to the ctx's call (ThreadSt.ov_api), which writes
         * them into tls only if it hands the call to the Python wrapper */
        PyObject *av[4] = {buf, dh.op_sum, PyTuple_GET_ITEM(scale, 2), Py_True};
        ThreadSt *T = &tl;
        take.nofut = nofut;
        take.want_dr = dr_out != NULL;
        t_ddp_take = &take;
        t_ddp_iss = iss;
        t_ddp_iss_buf = buf;
        T->ov_api = dh.api;
        T->ov_detail = detail;
        T->ov = 1;
        work = PyObject_Vectorcall(dh.ctx, av, 4, NULL);
        T = &tl;
        T->ov_api = T->ov_detail = NULL;
        T->ov = 0;
        t_ddp_take = NULL;
        t_ddp_iss = NULL;
        t_ddp_iss_buf = NULL;
    }
    if (work == NULL)
        goto out;
    n_ddp++;
    res = 1;
    *work_out = work;
    *row_out = take.row;
    *fut_out = take.fut;
    if (dr_out != NULL)
        *dr_out = take.dr;
    take.dr = NULL;
    take.row = take.fut = NULL;
out:
    if (res == 0)
        CLEAR_ERR();
    if (take.dr != NULL) {   /* not handed over (no Work): no callback will come */
        dr_unref((DRec *)take.dr);
        dr_unref((DRec *)take.dr);
    }
    Py_XDECREF(take.fut); Py_XDECREF(take.row);
    Py_XDECREF(rec); Py_XDECREF(scale); Py_XDECREF(detail);
    return res;
}

/* ddp_hook(state, bucket): the comm hook commtrace registers (state: ddp._HookState). */
static PyObject *ddp_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ddp_hook(state, bucket)");
        return NULL;
    }
    PyObject *state = args[0], *bucket = args[1];
    if (!dh.on)
        return ddp_fallback(state, bucket);
    PyObject *buf = PyObject_CallMethodNoArgs(bucket, s_buffer);
    PyObject *idx = buf != NULL ? PyObject_CallMethodNoArgs(bucket, s_index) : NULL;
    PyObject *work, *row, *fut, *ret = NULL;
    int r = ddp_issue(state, buf, idx, bucket, NULL, 0, &work, &row, &fut, NULL);
    Py_XDECREF(buf);
    Py_XDECREF(idx);
    if (r == 0)
        return ddp_fallback(state, bucket);
    if (r < 0)
        return NULL;
    DoneCB *cb = done_new(row, ddp_then_vectorcall);
    if (cb != NULL) {
        Py_CLEAR(row);
        if (fut == NULL)
            fut = PyObject_CallMethodNoArgs(work, s_get_future);
        if (fut != NULL) {
            PyObject *av[2] = {fut, (PyObject *)cb};
            ret = PyObject_VectorcallMethod(s_then, av, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            NULL);
            cb->attaching = 0;
        }
        Py_DECREF(cb);
    }
    Py_XDECREF(fut); Py_XDECREF(row); Py_DECREF(work);
    return ret;
}

/* The C++ comm hook (commtrace/capture/_ddp_hook.cpp, built on demand against the installed
 * torch: commtrace/capture/accel.py) reaches this path through a capsule of C function
 * pointers, so that the row it records is this path's, field for field. Its version is
 * checked by the C++ side. All but now take the GIL held. */
/* ---------------------------------------------------------------------------------------
 * The recording group's bucket recorded without a Python call (DdpCxxApi v5, session 30).
 * The C++ recording group asks direct_pre for a bucket's record before it issues the bucket's
 * all-reduce itself (c10d's C++ API, the GIL released), then hands the result to direct_post.
 * direct_pre takes the bucket only where every fact the all_reduce FastCtx would read is
 * already cached and valid (the recorder, the thread's state, NVTX off, the step, the group,
 * the dtype and device learned by an earlier call of that ctx, the bucket's detail text, the
 * model's hook state as ddp_issue reads it), and records what ctx_vectorcall + as_issue record
 * as a DRec, field for field, from those caches: the row is the same (the equality
 * tests compare it with the Python path's). No Python tensor object (THPVariable_Wrap and its
 * free), no index object, no vectorcall of the ctx or of ddp_allreduce per bucket. Anything
 * else: 0, nothing done, and the caller takes issue_dr (the ctx route), which learns what is
 * missing for the next bucket.
 * ------------------------------------------------------------------------------------- */
typedef struct {
    void *d;                 /* the DRec (NULL: not kept, counted as dropped) */
    PyObject *rec;           /* borrowed, H.n_busy held */
    PyObject *tkey, *tname;  /* the torch seq check (new references), or NULL */
    long long tslot, op_id, seq;
} DdpTicket;

static unsigned long long n_direct, n_direct_not;

static int ddp_direct_pre(PyObject *state, PyObject *group, long long idx, long long numel,
                          PyObject *dtype, DdpTicket *tk) {
    tk->d = NULL;
    tk->rec = tk->tkey = tk->tname = NULL;
    if (!dh.on || !dr_on || dh.ctx == NULL || !as_on || as_cxx_work == NULL)
        return 0;
    FastCtx *c = (FastCtx *)dh.ctx;
    ThreadSt *T = thread_st();
    PyObject *rec = H.e_rec;
    PyObject *st = T->state;
    if (UNLIKELY(T->depth || T->ov || !HAVE_DVER || !H.e_rec_ok ||
                 c->recmod_d != H.e_recmod_d || rec == NULL || rec == Py_None ||
                 H.c_rec != rec || !H.c_now_ok || acst.rec != rec || !acst.callback ||
                 acst.hz_full || !acst.now_ok ||
                 st == NULL || T->st_d != st || DVER(st) != T->st_v ||
                 !H.e_nvtx_ok || c->nvtx_d != H.e_nvtx_d ||
                 (H.e_rd_ok & RD_DT) ||
                 !((H.e_rd_ok & 3) == 1 ||
                   ((H.e_rd_ok & 3) == 2 && DVER(H.c_rdict) == H.e_rdict_v)) ||
                 group != c->last_key || c->last_gen != H.pg_gen || c->last_name == NULL ||
                 c->last_slot < 0 || c->last_slot >= H.c_seq_n || !H.c_op_c ||
                 dtype != c->last_dtype || c->last_dev == NULL || c->last_dev_v != -1 ||
                 !PyDict_Check(dh.coalesce) || PyDict_GET_SIZE(dh.coalesce) != 0))
        goto not_this;
    /* the model's hook state, as ddp_issue reads it: no hook of the user's, and the group
     * the bucket's all_reduce is for is this group */
    {
        if (!no_user_hook(state))
            goto not_this;
        PyObject *scale = PyObject_GetAttr(state, s_scale);
        int ok = scale != NULL && PyTuple_Check(scale) && PyTuple_GET_SIZE(scale) == 3 &&
                 PyTuple_GET_ITEM(scale, 2) == group;
        Py_XDECREF(scale);
        if (!ok)
            goto not_this;
        if (PySet_Contains(dh.dtypes, dtype) != 1)
            goto not_this;
    }
    PyObject *detail;
    {
        PyObject *ik = PyLong_FromLongLong(idx);
        detail = ik != NULL ? PyDict_GetItemWithError(dh.details, ik) : NULL;
        Py_XDECREF(ik);
        if (detail == NULL)
            goto not_this;   /* first sight of this bucket: the ctx route names it */
    }
    /* From here on the bucket is this route's (its seq is taken). */
    H.n_busy++;
    Rec r;
    r.count = numel;
    r.outb = r.peer = r.root = NONE_LL;
    r.dtype = dtype;          /* borrowed: kept (keep_dtype) */
    r.dev = c->last_dev;      /* borrowed: kept (dev_name) */
    r.step = H.e_step;
    r.t0 = now_ns();
    r.seq = H.c_seq_v[2 * c->last_slot]++;
    int site_own = rec_group_site(c, T, &r);
    r.op_id = H.c_op_next++;
    r.own = site_own ? REC_OWN_SITE : 0;
    r.api = dh.api;
    Py_INCREF(r.api);
    r.detail = detail;
    Py_INCREF(detail);
    CLEAR_ERR();
    c->n_fast++;
    tk->rec = rec;
    tk->op_id = r.op_id;
    tk->seq = r.seq;
    tk->tslot = c->last_slot;
    if (H.ts_gap != NULL && c->last_tseq) {
        tk->tkey = c->last_key;
        Py_INCREF(tk->tkey);
        tk->tname = c->last_name;
        Py_INCREF(tk->tname);
    }
    stamps_flush_now();
    DRec *d = dr_new(rec, &r);
    tk->d = d;
    n_direct++;
    n_ddp++;   /* a bucket of the C path, as ddp_issue counts its own */
    return 1;
not_this:
    CLEAR_ERR();
    n_direct_not++;
    return 0;
}

/* After the all-reduce of a bucket direct_pre took (GIL held): issued 1, its return time
 * stamped now, the torch seq check, and the DRec returned for the caller to attach dr_stamp
 * to the Work's future (then dr_attached), or NULL (not kept, or a final flush wrote it
 * meanwhile). issued 0: the all-reduce raised, its error set as the Python exception
 * (translate_exception_to_python): the row written with it, as as_issue writes a raising
 * call's; the Python error is cleared. */
static void *ddp_direct_post(DdpTicket *tk, int issued) {
    long long t1 = now_ns();
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *rec = tk->rec;
    DRec *d = (DRec *)tk->d;
    if (tk->tkey != NULL) {
        tseq_after(NULL, rec, tk->tkey, (Py_ssize_t)tk->tslot, tk->tname, -1, tk->op_id,
                   tk->seq, -1);
        CLEAR_ERR();
    }
    Py_CLEAR(tk->tkey);
    Py_CLEAR(tk->tname);
    void *out = d != NULL ? dr_after(d, rec, issued, 1, t1, &et, &ev, &etb) : NULL;
    Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
    tk->d = NULL;
    tk->rec = NULL;
    rec_busy_end();
    return out;
}

static PyObject *ddp_direct_route_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(KK)", n_direct, n_direct_not);
}

typedef struct {
    int version;
    /* iss: the C++ side's scaling and all_reduce (interface v2), or NULL: both through
     * Python (the method call, ProcessGroup.allreduce by pybind). Either way *fut is NULL:
     * the C++ side takes the Work's future in C++. */
    int (*issue)(PyObject *state, PyObject *buf, PyObject *idx, PyObject *detail_arg,
                 DdpIssuer *iss, PyObject **work, PyObject **row, PyObject **fut);
    void (*stamp)(PyObject *row, long long t, int observed);
    long long (*now)(void);   /* the rows' clock; any thread, no GIL */
    /* version 4 (session 30): issue, where the caller takes a C record (DRec) */
    int (*issue_dr)(PyObject *state, PyObject *buf, PyObject *idx, PyObject *detail_arg,
                    DdpIssuer *iss, PyObject **work, PyObject **row, PyObject **fut,
                    void **dr);
    void (*dr_stamp)(void *dr, long long t);   /* any thread, no GIL */
    void (*dr_attached)(void *dr);             /* the issuer's thread, after the attach */
    /* version 5: the recording group's bucket without a Python call (ddp_direct_pre) */
    int (*direct_pre)(PyObject *state, PyObject *group, long long idx, long long numel,
                      PyObject *dtype, DdpTicket *tk);
    void *(*direct_post)(DdpTicket *tk, int issued);
} DdpCxxApi;

/* Release at the stamp (issue 20, session 17): the op whose end a C++ hook's stamp has just
 * written is released then and there when its Work is gone (or it was waited) and it has no
 * device token and no NVTX range (pending_releasable, the test service_pass makes): the
 * decision the writer's service takes at its next pass, up to IDLE_WAKE_S later, for a reason
 * other than the hold. The stamps are written on the training thread a bucket or a step
 * after the op's issue (the next bucket's issue, DDP's parseHookResult, the next forward), its
 * objects still in cache; the service found them cold (~1.4 us of the writer's CPU per DDP
 * bucket, docs/performance.md session 17). A release that would tell a listener "nothing
 * pending" now (a listener that takes it at once: hazards' full mode) is left to the service: no
 * listener runs inside DDP's hook. stamp_release(False) turns it off (benchmarks' A/B). */
static int stamp_release_on = 1;

static void as_release_stamped(PyObject *row) {
    if (!stamp_release_on || !as_on || as_pending_type == NULL || dh.recmod == NULL ||
        !PyList_CheckExact(row) || PyList_GET_SIZE(row) != C_NCOL ||
        PyList_GET_ITEM(row, C_T_END) == Py_None)
        return;
    PyObject *rec = fast_attr(dh.recmod_d, dh.recmod, s_recorder);
    if (rec == NULL || rec == Py_None || as_cache(rec) != 0) {
        Py_XDECREF(rec);
        CLEAR_ERR();
        return;
    }
    PyObject *p = PyDict_GetItemWithError(acst.pending, PyList_GET_ITEM(row, C_OP_ID));
    int waited, alive;
    if (p == NULL || !pending_releasable(p, &waited, &alive) || pget(p, P_ROW) != row) {
        Py_DECREF(rec);
        CLEAR_ERR();
        return;
    }
    if ((waited || !alive) && (PyDict_GET_SIZE(acst.pending) > 1 ||
                               PyList_GET_SIZE(acst.listeners) == 0 ||
                               PyDict_GetItemWithError(acst.rdict, s_lazy_idle) == Py_True)) {
        Py_INCREF(p);   /* the pending dict's reference goes in the release */
        as_release(rec, p);
        Py_DECREF(p);
    }
    Py_DECREF(rec);
    CLEAR_ERR();
}

/* A switch of this module's (stamp_release, step_direct): *flag set to bool(arg), the previous
 * setting returned. */
static PyObject *flag_swap(int *flag, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = *flag;
    *flag = on;
    return PyBool_FromLong(was);
}

static PyObject *stamp_release(PyObject *module, PyObject *arg) {
    return flag_swap(&stamp_release_on, arg);
}

static void ddp_cxx_stamp(PyObject *row, long long t, int observed) {
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    as_complete(row, t, observed ? s_how_observed : s_how_callback);
    CLEAR_ERR();
    as_release_stamped(row);
    CLEAR_ERR();
    PyErr_Restore(et, ev, etb);
}

static long long ddp_cxx_now(void) {
    return now_ns();
}

/* ddp_issue for the C++ hook: it takes the Work's future in C++ (never a Python one) */
static int ddp_cxx_issue(PyObject *state, PyObject *buf, PyObject *idx, PyObject *detail_arg,
                         DdpIssuer *iss, PyObject **work, PyObject **row, PyObject **fut) {
    return ddp_issue(state, buf, idx, detail_arg, iss, 1, work, row, fut, NULL);
}

/* The same where the caller takes a C record (DRec, *dr: the recording group) when one is
 * made: then *row is NULL, and the caller attaches dr_stamp to the Work's future and calls
 * dr_attached once it is attached. */
static int ddp_cxx_issue_dr(PyObject *state, PyObject *buf, PyObject *idx,
                            PyObject *detail_arg, DdpIssuer *iss, PyObject **work,
                            PyObject **row, PyObject **fut, void **dr) {
    return ddp_issue(state, buf, idx, detail_arg, iss, 1, work, row, fut, dr);
}

static const DdpCxxApi ddp_cxx = {5, ddp_cxx_issue, ddp_cxx_stamp, ddp_cxx_now,
                                   ddp_cxx_issue_dr, dr_stamp, dr_attached, ddp_direct_pre,
                                   ddp_direct_post};

static PyObject *ddp_cxx_api(PyObject *module, PyObject *unused) {
    return PyCapsule_New((void *)&ddp_cxx, "commtrace.capture._fastpath.ddp_cxx_api", NULL);
}

/* ddp_setup(fallback, ctx, recorder_module, tls, details, detail_of, dtypes, op_sum, opts,
 *           pg_coalesce_state, torch_all_reduce, api) */
static PyObject *ddp_setup(PyObject *module, PyObject *args) {
    PyObject *v[12];
    if (!PyArg_ParseTuple(args, "OOOOO!OO!OOO!OU", &v[0], &v[1], &v[2], &v[3], &PyDict_Type,
                          &v[4], &v[5], &PyFrozenSet_Type, &v[6], &v[7], &v[8], &PyDict_Type,
                          &v[9], &v[10], &v[11]))
        return NULL;
    if (Py_TYPE(v[1]) != &FastCtxType) {
        PyErr_SetString(PyExc_TypeError, "ddp_setup: ctx must be a FastCtx");
        return NULL;
    }
    PyObject **slots[12] = {&dh.fallback, &dh.ctx, &dh.recmod, &dh.tls, &dh.details,
                            &dh.detail_of, &dh.dtypes, &dh.op_sum, &dh.opts, &dh.coalesce,
                            &dh.orig, &dh.api};
    for (int i = 0; i < 12; i++) {
        Py_INCREF(v[i]);
        Py_XSETREF(*slots[i], v[i]);
    }
    PyObject *d = dict_of(dh.recmod);
    Py_XSETREF(dh.recmod_d, d);
    CLEAR_ERR();
    dh.on = 1;
    Py_RETURN_NONE;
}

static PyObject *ddp_off(PyObject *module, PyObject *unused) {
    dh.on = 0;
    Py_RETURN_NONE;
}

static PyObject *ddp_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("(KK)", n_ddp, n_ddp_fallback);
}

static int ddp_init(void) {
#define DDP_INTERN(var, text) do { var = PyUnicode_InternFromString(text); if (!var) return -1; } while (0)
    DDP_INTERN(s_user_hook, "user_hook"); DDP_INTERN(s_scale, "scale");
    DDP_INTERN(s_buffer, "buffer"); DDP_INTERN(s_index, "index");
    DDP_INTERN(s_allreduce, "allreduce"); DDP_INTERN(s_then, "then");
    DDP_INTERN(s_value, "value"); DDP_INTERN(s_mul_, "mul_"); DDP_INTERN(s_div_, "div_");
#undef DDP_INTERN
    as_cxx_work = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (as_cxx_work == NULL)
        return -1;
    return 0;
}

#define DDP_METHODS                                                                          \
    {"ddp_hook", (PyCFunction)(void (*)(void))ddp_hook, METH_FASTCALL,                      \
     "ddp_hook(state, bucket): commtrace's DDP comm hook (ddp.py)."},                       \
    {"ddp_allreduce", (PyCFunction)(void (*)(void))ddp_allreduce, METH_FASTCALL,            \
     "ddp_allreduce(tensor, op, group, async_op): the DDP hook's all_reduce."},             \
    {"ddp_setup", ddp_setup, METH_VARARGS, "ddp_setup(...): turn ddp_hook's C path on."},   \
    {"ddp_off", ddp_off, METH_NOARGS, "Send every bucket to the Python dispatcher."},        \
    {"ddp_counts", ddp_counts, METH_NOARGS, "(buckets issued by ddp_hook, handed to Python)."}, \
    {"ddp_cxx_api", ddp_cxx_api, METH_NOARGS, "Capsule of the C++ DDP hook's entry points."}, \
    {"stamp_release", stamp_release, METH_O,                                                \
     "stamp_release(on) -> the previous setting: release a C++ hook's op at its stamp."},

/* ---------------------------------------------------------------------------------------
 * End of DDP's comm hook in C.
 * ------------------------------------------------------------------------------------- */

/* ---------------------------------------------------------------------------------------
 * The step marker and the hazard check's host reads in C (issue 20, the pipeline sample):
 * per step, the optimizer step post-hook (steps.py) was 7 Python frames, and each host read
 * (`loss.item()`) while hazard detection is active 4 more (hazards.py). Both keep the Python
 * functions as their fallback and record the same rows.
 * ------------------------------------------------------------------------------------- */
static PyObject *mk_steps_d;     /* steps.__dict__: _opt_ref, _hook (the Python hook), _warn */
static PyObject *mk_recmod_d;    /* recorder.__dict__: _recorder */
static PyObject *mk_kind, *mk_detail;            /* schema.KIND_MARK, "optimizer.step" */
static PyObject *mk_site_of_frame, *mk_code_internal, *mk_site_pairs;   /* sites.py's */
static PyObject *mk_site_str;    /* site pair -> its "file:line" string (mark_site) */
#define MK_SITE_STR_MAX 4096
static unsigned long long n_marks, n_marks_py, n_marks_direct;
/* step_direct(False): the step through the recorder's property (benchmarks' A/B) */
static int step_direct_on = 1;

static PyObject *step_direct(PyObject *module, PyObject *arg) {
    return flag_swap(&step_direct_on, arg);
}
static PyObject *s_manual_steps, *s_opt_ref, *s_hook_py, *s_warn_py, *s_hz_recorder,
    *s_last_change, *s_unpatch_after, *s_monotonic;

/* steps_setup(steps_module, recorder_module, KIND_MARK, detail, site_of_frame,
 * code_internal, site_pairs): step_hook's tables. */
static PyObject *steps_setup(PyObject *module, PyObject *args) {
    PyObject *sm, *rm, *kind, *detail, *sof, *ci, *sp;
    if (!PyArg_ParseTuple(args, "OOUUOO!O!", &sm, &rm, &kind, &detail, &sof, &PyDict_Type, &ci,
                          &PyDict_Type, &sp))
        return NULL;
    PyObject *sd = dict_of(sm), *rd = dict_of(rm);
    if (sd == NULL || rd == NULL) {
        Py_XDECREF(sd); Py_XDECREF(rd);
        PyErr_SetString(PyExc_TypeError, "steps_setup: modules expected");
        return NULL;
    }
    Py_XSETREF(mk_steps_d, sd); Py_XSETREF(mk_recmod_d, rd);
    Py_INCREF(kind); Py_XSETREF(mk_kind, kind);
    Py_INCREF(detail); Py_XSETREF(mk_detail, detail);
    Py_INCREF(sof); Py_XSETREF(mk_site_of_frame, sof);
    Py_INCREF(ci); Py_XSETREF(mk_code_internal, ci);
    Py_INCREF(sp); Py_XSETREF(mk_site_pairs, sp);
    Py_RETURN_NONE;
}

/* sites.user_site() seen from the hook: "file:line" of the first user frame from the calling
 * frame outwards (the Python hook's emit() starts at its own frame, internal, then the same
 * frames), or None. New reference; NULL on error. */
static PyObject *mark_site(void) {
    PyObject *res = NULL;
#if CT_IFRAME
    /* the walk over the interpreter frames where its tables know the frames (call_site's) */
    {
        _PyInterpreterFrame *fr = PyThreadState_GET()->cframe->current_frame;
        if (fr != NULL && mk_code_internal != NULL && mk_site_pairs != NULL)
            res = site_walk_frames(fr, mk_code_internal, mk_site_pairs, 0);
    }
    if (res != NULL)
        goto found;
#endif
#if PY_VERSION_HEX >= 0x030B0000
    PyFrameObject *f = PyEval_GetFrame();   /* borrowed */
    if (f == NULL)
        Py_RETURN_NONE;
    Py_INCREF(f);
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *k = PyLong_FromVoidPtr(code);
    PyObject *internal = k ? PyDict_GetItemWithError(mk_code_internal, k) : NULL;
    if (internal == Py_True) {
        res = site_walk_in(mk_code_internal, mk_site_pairs, f);
    } else if (internal == Py_False) {
        PyObject *li = PyLong_FromLong(PyFrame_GetLasti(f));
        PyObject *key = li ? PyTuple_Pack(2, k, li) : NULL;
        Py_XDECREF(li);
        res = key ? PyDict_GetItemWithError(mk_site_pairs, key) : NULL;
        Py_XINCREF(res);
        Py_XDECREF(key);
    }
    CLEAR_ERR();
    if (res == NULL)   /* not classified yet: the Python walk fills the caches */
        res = PyObject_CallOneArg(mk_site_of_frame, (PyObject *)f);
    Py_XDECREF(k);
    Py_DECREF(code);
    Py_DECREF(f);
#else
    PyObject *gf = PySys_GetObject("_getframe");   /* borrowed */
    PyObject *f = gf ? PyObject_CallNoArgs(gf) : NULL;
    if (f == NULL)
        return NULL;
    res = PyObject_CallOneArg(mk_site_of_frame, f);
    Py_DECREF(f);
#endif
    if (res == NULL || res == Py_None)
        return res;
#if CT_IFRAME
found:
#endif
    /* sites.format_site: the Python hook's emit() stores the formatted string. One string
     * object per site (mk_site_str), not one per step: the writer encodes a string column
     * once per distinct object (pack_rows' tables are by identity), so a new string per mark
     * cost each mark row a table entry of its own, formatted and encoded in Python at the
     * flush (about 10 us per DDP step here; docs/performance.md). */
    PyObject *s = NULL;
    if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
        if (mk_site_str == NULL)
            mk_site_str = PyDict_New();
        s = mk_site_str ? PyDict_GetItemWithError(mk_site_str, res) : NULL;   /* borrowed */
        if (s != NULL) {
            Py_INCREF(s);
        } else {
            CLEAR_ERR();
            s = PyUnicode_FromFormat("%S:%S", PyTuple_GET_ITEM(res, 0), PyTuple_GET_ITEM(res, 1));
            if (s != NULL && mk_site_str != NULL) {
                if (PyDict_GET_SIZE(mk_site_str) >= MK_SITE_STR_MAX)
                    PyDict_Clear(mk_site_str);   /* bounded: sites of marks are few */
                if (PyDict_SetItem(mk_site_str, res, s) < 0)
                    CLEAR_ERR();
            }
        }
    } else if (PyUnicode_Check(res)) {
        s = res;
        Py_INCREF(s);
    } else
        PyErr_SetString(PyExc_TypeError, "unexpected site");
    Py_DECREF(res);
    return s;
}

/* steps._hook in C: the same checks, the same step and the same "mark" row as
 * Recorder.emit(kind="mark", step=..., detail="optimizer.step"). Anything it does not
 * handle goes to the Python hook before any state changed; an error after is handed to
 * steps._warn (logged once), as the Python hook logs its own. */
static PyObject *step_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (mk_steps_d == NULL || nargs < 1)
        goto python;
    PyObject *rec = PyDict_GetItemWithError(mk_recmod_d, s_recorder);   /* borrowed */
    if (rec == NULL) {
        CLEAR_ERR();
        goto python;
    }
    if (rec == Py_None)
        Py_RETURN_NONE;
    if (!as_usable(rec))
        goto python;
    PyObject *opt = args[0];
    PyObject *manual = PyDict_GetItemWithError(acst.rdict, s_manual_steps);
    if (manual == NULL || !PyBool_Check(manual)) {
        CLEAR_ERR();
        goto python;
    }
    if (manual == Py_True)
        Py_RETURN_NONE;
    Py_INCREF(rec);
    PyObject *row = NULL, *step1 = NULL;
    PyObject *ref = PyDict_GetItemWithError(mk_steps_d, s_opt_ref);   /* borrowed */
    if (ref == NULL && PyErr_Occurred())
        goto error;
    PyObject *cur = (ref == NULL || ref == Py_None) ? Py_None :
        (PyWeakref_Check(ref) ? PyWeakref_GetObject(ref) : NULL);
    if (cur == NULL)
        goto error;
    if (cur == Py_None) {
        PyObject *r = PyWeakref_NewRef(opt, NULL);
        if (r == NULL || PyDict_SetItem(mk_steps_d, s_opt_ref, r) < 0) {
            Py_XDECREF(r);
            goto error;
        }
        Py_DECREF(r);
    } else if (cur != opt) {
        Py_DECREF(rec);
        Py_RETURN_NONE;
    }
    /* rec.step = (rec.step or 0) + 1. Where this recorder's class has recorder.py's step and
     * device_timer properties (H.c_rd_notify, decided for H.c_rec), the value behind them,
     * `_step` in the instance dict, is read and written here, and the C path's cached step
     * (H.e_step) set to it as the setter's rd_changed() and the next op's refresh would: no
     * Python frame per training step (the getter, the setter, recorder._rd_changed, and the
     * next op's two getters: five per step; at most 0.8% of the DDP sample's step at 2 ranks,
     * benchmarks/steps.py --control variant:step-property; issue 20, session 29). Otherwise
     * through the properties. */
    PyObject *rd = H.c_rdict;
    int direct = step_direct_on && H.c_rd_notify && H.c_rec == rec && rd != NULL &&
                 PyDict_CheckExact(rd);
    PyObject *step = NULL;
    if (direct) {
        step = PyDict_GetItemWithError(rd, s__step);   /* borrowed */
        if (step != NULL)
            Py_INCREF(step);
        else if (PyErr_Occurred())
            goto error;
        else
            direct = 0;
    }
    if (!direct)
        step = PyObject_GetAttr(rec, s_step);
    if (step == NULL)
        goto error;
    int t = PyObject_IsTrue(step);
    step1 = t < 0 ? NULL : PyNumber_Add(t ? step : i_zero, i_one);
    Py_DECREF(step);
    if (step1 == NULL)
        goto error;
    if (direct) {
        if (PyDict_SetItem(rd, s__step, step1) < 0)
            goto error;
        /* rd_changed(), less the refresh: the device timer did not change */
        long long v = as_ll(step1);
        H.rd_epoch++;
        if ((H.e_rd_ok & 3) == 1 && v != NONE_LL)
            H.e_step = v;
        else
            H.e_rd_ok = 0;
        n_marks_direct++;
    } else if (PyObject_SetAttr(rec, s_step, step1) < 0) {
        goto error;
    }
    n_marks++;
    /* Recorder.emit's row: kind, rank, thread, step, t_enqueue_ns, site (config.stack), detail */
    row = PyList_New(C_NCOL);
    if (row == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < C_NCOL; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(row, i, Py_None);
    }
    PyObject *tn = PyLong_FromLongLong(now_ns());   /* acst.now_ok: rec.now_ns is time_ns */
    PyObject *rank = PyObject_GetAttr(rec, s_rank);
    PyObject *th = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    PyObject *cfg = PyObject_GetAttr(rec, s_config);
    PyObject *stk = cfg ? PyObject_GetAttr(cfg, s_stack) : NULL;
    int want_site = stk ? PyObject_IsTrue(stk) : -1;
    Py_XDECREF(cfg); Py_XDECREF(stk);
    PyObject *site = want_site > 0 ? mark_site() : want_site == 0 ? Py_NewRef(Py_None) : NULL;
    if (tn == NULL || rank == NULL || th == NULL || site == NULL) {
        Py_XDECREF(tn); Py_XDECREF(rank); Py_XDECREF(th); Py_XDECREF(site);
        goto error;
    }
    Py_INCREF(mk_kind); Py_INCREF(mk_detail); Py_INCREF(step1);
    PyList_SetItem(row, C_KIND, mk_kind);
    PyList_SetItem(row, C_RANK, rank);
    PyList_SetItem(row, C_THREAD, th);
    PyList_SetItem(row, C_STEP, step1);
    PyList_SetItem(row, C_T_ENQ, tn);
    PyList_SetItem(row, C_SITE, site);
    PyList_SetItem(row, C_DETAIL, mk_detail);
    as_append(rec, row);
    Py_DECREF(row);
    Py_DECREF(step1);
    Py_DECREF(rec);
    Py_RETURN_NONE;
error: {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        PyObject *w = PyDict_GetItemWithError(mk_steps_d, s_warn_py);
        PyObject *x = w && ev ? PyObject_CallOneArg(w, ev) : NULL;
        Py_XDECREF(x);
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
        CLEAR_ERR();
        Py_XDECREF(row); Py_XDECREF(step1);
        Py_DECREF(rec);
        Py_RETURN_NONE;
    }
python: {
        CLEAR_ERR();
        n_marks_py++;
        PyObject *h = mk_steps_d ? PyDict_GetItemWithError(mk_steps_d, s_hook_py) : NULL;
        if (h == NULL) {
            CLEAR_ERR();
            Py_RETURN_NONE;
        }
        return PyObject_Vectorcall(h, args, nargs, NULL);
    }
}

/* A host-read method of torch.Tensor (hazards._make_reader's reader) whose common case runs
 * here: detection not active and not due to restore torch's methods, or active with no
 * pending op left unwaited (a check would find nothing) -> torch's method at once. Anything
 * else (an op not waited, a recorder the async path does not know, due to unpatch) -> the
 * Python reader, which checks. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *orig, *py, *state, *hzmod;
    PyObject *state_d, *hzmod_d;   /* _S.__dict__, hazards.__dict__ */
} HzReader;

static unsigned long long n_reads_c, n_reads_py;

/* 1: torch's method can run unchecked now; 0: ask the Python reader. */
static int hz_clear(HzReader *h) {
    PyObject *active = PyDict_GetItemWithError(h->state_d, s_active);   /* borrowed */
    if (active == Py_False) {
        /* reader: `if monotonic() - last_change >= UNPATCH_AFTER_S: _lazy_unpatch()` */
        PyObject *mono = PyDict_GetItemWithError(h->hzmod_d, s_monotonic);
        PyObject *after = PyDict_GetItemWithError(h->hzmod_d, s_unpatch_after);
        PyObject *last = PyDict_GetItemWithError(h->state_d, s_last_change);
        if (mono == NULL || after == NULL || last == NULL || !PyFloat_Check(last))
            return 0;
        double a = PyFloat_AsDouble(after);
        PyObject *now = PyObject_CallNoArgs(mono);
        double n = now && PyFloat_Check(now) ? PyFloat_AS_DOUBLE(now) : -1.0;
        Py_XDECREF(now);
        if (PyErr_Occurred() || n < 0)
            return 0;
        return n - PyFloat_AS_DOUBLE(last) < a;
    }
    if (active != Py_True)
        return 0;
    PyObject *rec = PyDict_GetItemWithError(h->state_d, s_hz_recorder);
    if (rec == NULL)
        return 0;
    if (rec == Py_None)
        return 1;   /* check() returns at once */
    if (!as_on || as_cache(rec) != 0)
        return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *p;
    while (PyDict_Next(acst.pending, &pos, &key, &p)) {
        if (Py_TYPE(p) != (PyTypeObject *)as_pending_type || pget(p, P_WAITED) != Py_True)
            return 0;
    }
    return 1;
}

static PyObject *hz_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    HzReader *h = (HzReader *)self;
    int clear = hz_clear(h);
    CLEAR_ERR();
    if (clear) {
        n_reads_c++;
        return PyObject_Vectorcall(h->orig, args, nargsf, kwnames);
    }
    n_reads_py++;
    return PyObject_Vectorcall(h->py, args, nargsf, kwnames);
}

static void hz_dealloc(HzReader *h) {
    Py_CLEAR(h->dict); Py_CLEAR(h->orig); Py_CLEAR(h->py); Py_CLEAR(h->state);
    Py_CLEAR(h->hzmod); Py_CLEAR(h->state_d); Py_CLEAR(h->hzmod_d);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyTypeObject HzReaderType = METHOD_WRAPPER_TYPE(
    HzReader, hz_dealloc, "commtrace.capture._fastpath.HazardReader",
    "A host-read method of torch.Tensor checked by hazard detection (hazards.py).");

/* hazard_reader(orig, python_reader, hazards._S, hazards_module) */
static PyObject *hazard_reader(PyObject *module, PyObject *args) {
    HzReader *h = (HzReader *)new_wrapper(&HzReaderType, hz_vectorcall, args,
                                          offsetof(HzReader, orig), 4);
    if (h == NULL)
        return NULL;
    h->state_d = dict_of(h->state);
    h->hzmod_d = dict_of(h->hzmod);
    if (h->state_d == NULL || h->hzmod_d == NULL) {
        Py_DECREF(h);
        PyErr_SetString(PyExc_TypeError, "hazard_reader: objects with a __dict__ expected");
        return NULL;
    }
    return (PyObject *)h;
}

static PyObject *pipe_counts(PyObject *module, PyObject *unused) {
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "marks", n_marks, "marks_python", n_marks_py,
                         "marks_direct", n_marks_direct, "reads", n_reads_c,
                         "reads_python", n_reads_py);
}

static int pipe_init(void) {
    if (PyType_Ready(&HzReaderType) < 0)
        return -1;
#define PIPE_INTERN(var, text) do { var = PyUnicode_InternFromString(text); if (!var) return -1; } while (0)
    PIPE_INTERN(s_manual_steps, "manual_steps"); PIPE_INTERN(s_opt_ref, "_opt_ref");
    PIPE_INTERN(s_hook_py, "_hook"); PIPE_INTERN(s_warn_py, "_warn");
    PIPE_INTERN(s_hz_recorder, "recorder"); PIPE_INTERN(s_last_change, "last_change");
    PIPE_INTERN(s_unpatch_after, "UNPATCH_AFTER_S"); PIPE_INTERN(s_monotonic, "_monotonic");
#undef PIPE_INTERN
    return 0;
}

#define PIPE_METHODS                                                                         \
    {"steps_setup", steps_setup, METH_VARARGS,                                              \
     "steps_setup(steps, recorder, KIND_MARK, detail, site_of_frame, code_internal, "       \
     "site_pairs): turn step_hook's C path on."},                                           \
    {"step_hook", (PyCFunction)(void (*)(void))step_hook, METH_FASTCALL,                    \
     "step_hook(optimizer, args, kwargs): steps._hook in C (the optimizer step marker)."},  \
    {"hazard_reader", hazard_reader, METH_VARARGS,                                          \
     "hazard_reader(orig, python_reader, state, hazards_module): a host-read method whose " \
     "common case runs in C."},                                                             \
    {"step_direct", step_direct, METH_O,                                                    \
     "step_direct(on) -> the previous setting: the step marker sets the step in C."},       \
    {"pipe_counts", pipe_counts, METH_NOARGS,                                               \
     "{marks, marks_python, marks_direct, reads, reads_python}: step marks and host reads, " \
     "C / Python (marks_direct: C marks that set the step without its property)."},

/* ---------------------------------------------------------------------------------------
 * End of the step marker and hazard readers in C.
 * ------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    DDP_METHODS
    DR_METHODS
#if defined(SIGUSR1) && !defined(_WIN32)
    {"usr1_install", usr1_install, METH_NOARGS,
     "Count SIGUSR1 (chained to the handler it replaces); returns the count so far."},
    {"usr1_uninstall", usr1_uninstall, METH_NOARGS, "Put the replaced SIGUSR1 handler back."},
    {"usr1_count", usr1_count, METH_NOARGS, "SIGUSR1 signals received since the module loaded."},
#endif
    {"counts", counts, METH_NOARGS,
     "(calls recorded in C, calls handed to the Python wrapper, source line of the last)."},
    {"invalidate", invalidate, METH_NOARGS, "Forget cached process-group facts (and the groups)."},
    {"entry_changed", entry_changed, METH_NOARGS, "recorder._recorder or nvtx_ranges.active was assigned."},
    {"rd_changed", rd_changed, METH_NOARGS, "A recorder's step or device_timer was assigned."},
    {"rd_props", rd_props_set, METH_VARARGS, "Recorder's step and device_timer properties (their setters call rd_changed)."},
    {"instancemethod", instancemethod, METH_O, "Wrap a callable as a C++ class method."},
    {"around", around, METH_VARARGS, "around(orig, before, after): call orig from C between them."},
    {"depth", depth, METH_NOARGS, "True while this thread is inside a call the C path records."},
    {"set_tensor_api", set_tensor_api, METH_VARARGS, "set_tensor_api(numel, get_device, dtype_descriptor, exact_types)."},
    {"make_wait", make_wait, METH_VARARGS, "make_wait(orig_wait, python_wait, recorder_module)."},
    {"make_ctx", make_ctx, METH_VARARGS, "The per-wrapper context of call()."},
    {"set_async", set_async, METH_VARARGS,
     "set_async(PendingOp, track_work, record_error, KIND_OP, recorder_module, ncol): record "
     "async calls in C too."},
    {"async_off", async_off, METH_NOARGS, "Hand async calls to the Python wrapper again."},
    {"set_tseq_at_wait", set_tseq_at_wait, METH_O,
     "set_tseq_at_wait(flag) -> previous: read a blocking call's torch seq at its wait()."},
    {"set_prefetch", set_prefetch, METH_O,
     "set_prefetch(flag) -> previous: prefetch torch's tensor accessors at entry (default on)."},
    {"meta_counts", meta_counts, METH_NOARGS,
     "meta_counts() -> (tensor reads, torch seq reads) made through set_meta_api's capsule."},
    {"flush_stamps", flush_stamps, METH_NOARGS,
     "flush_stamps(): write the completion times queued by the C++ callbacks into their rows."},
    {"set_cxx_completion", set_cxx_completion, METH_O,
     "set_cxx_completion(flag) -> previous: async completion callbacks in C++ (default on)."},
    {"attach_counts", attach_counts, METH_NOARGS,
     "attach_counts() -> async completions attached in C++ (set_meta_api's capsule) so far."},
    {"set_devtimer_api", set_devtimer_api, METH_VARARGS,
     "set_devtimer_api(capsule or None, device_prefix): the C device timer's API."},
    {"set_meta_api", set_meta_api, METH_O,
     "set_meta_api(capsule or None) -> on: tensor / group reads through torch's C++ API."},
    {"tseq_reads", tseq_reads, METH_NOARGS,
     "tseq_reads() -> reads of torch's per-group sequence number so far (tests)."},
    {"set_tseq", set_tseq, METH_O,
     "set_tseq(on_gap or None): check torch's per-group seq after each call (torchseq.py)."},
    {"async_counts", async_counts, METH_NOARGS,
     "(async path on, async calls recorded in C)."},
    {"set_untrack_rows", set_untrack_rows, METH_O, "set_untrack_rows(flag): untrack async rows from the cyclic GC (default True)."},
    {"pack_rows", pack_rows, METH_VARARGS, "pack_rows(rows, kinds) -> None or (n, nums, codes, tables): queued rows as typed column buffers (issue 20)."},
    {"service_pass", service_pass, METH_VARARGS, "service_pass(rec, ops, now, hold_ns) -> ops left: the writer's service of the pending ops whose end is known, in C (issue 20)."},
    {"int_column", int_column, METH_VARARGS, "int_column(buf, j, n, width) -> None or (validity, nnull, data): an Arrow integer column (issue 20)."},
    {"bool_column", bool_column, METH_VARARGS, "bool_column(codes, j, n) -> (validity, nnull, values): an Arrow bool column (issue 20)."},
    {"string_column", string_column, METH_VARARGS, "string_column(codes, j, n, values) -> None or (validity, nnull, offsets, data): an Arrow string column (issue 20)."},
    {"records_batch", records_batch, METH_VARARGS, "records_batch(n, nums, codes, rank, program, pgs, specs, dtypes, strs, consts) -> None or an arrow_array capsule: drain_records' calls as one Arrow record batch (issue 20)."},
    {"drain_records", drain_records, METH_NOARGS, "drain_records() -> None or (n, nums, codes, tables): typed column buffers (issue 20)."},
    {"drain_columns", drain_columns, METH_NOARGS, "drain_columns() -> None or 19 column lists (F_* fields, t_return_ns)."},
    {"in_progress", in_progress, METH_VARARGS, "in_progress(take=False) -> [pre] of blocking calls in progress."},
    {"take_dropped", take_dropped, METH_NOARGS, "Calls not recorded since the last take (buffer full)."},
    {"buffered", buffered, METH_NOARGS, "Calls completed and not yet drained."},
    PIPE_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_fastpath", "commtrace's blocking fast path in C (optional).", -1,
    methods,
};

#define INTERN(var, text) do { var = PyUnicode_InternFromString(text); if (!var) return NULL; } while (0)

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&FastCtxType) < 0 || PyType_Ready(&WaitType) < 0 ||
        PyType_Ready(&AroundType) < 0 || PyType_Ready(&DoneType) < 0 ||
        PyType_Ready(&CountersType) < 0 || PyType_Ready(&OpIdsType) < 0 ||
        PyType_Ready(&PendLockType) < 0)
        return NULL;
    if (ddp_init() < 0)
        return NULL;
    if (pipe_init() < 0)
        return NULL;
    INTERN(s_recorder, "_recorder"); INTERN(s_dict, "__dict__"); INTERN(s_depth, "depth");
    INTERN(s_coalesce, "coalesce"); INTERN(s_api, "api");
    INTERN(s_detail, "detail"); INTERN(s_default_pg, "_default_pg"); INTERN(s_member, "member");
    INTERN(s_idx, "idx"); INTERN(s_name, "name"); INTERN(s_ranks, "ranks");
    INTERN(s_active, "active"); INTERN(s_device_timer, "device_timer");
    INTERN(s_device_rows, "_device_rows"); INTERN(s_cap, "cap");
    INTERN(s_now_ns, "now_ns"); INTERN(s_numel, "numel"); INTERN(s_dtype, "dtype");
    INTERN(s_get_device, "get_device"); INTERN(s_nbytes, "nbytes"); INTERN(s_seq, "seq");
    INTERN(s_p2p_seq, "p2p_seq"); INTERN(s_step, "step"); INTERN(s_stack, "stack");
    INTERN(s__step, "_step");
    INTERN(s_op_ids, "_op_ids");
    INTERN(s_cap, "cap");
    INTERN(s_rank, "rank"); INTERN(s_by_key, "_by_key");
    INTERN(s_seq_slot, "seq_slot"); INTERN(s_seqs, "_seqs"); INTERN(s_tseq, "tseq");
    INTERN(s_tseqs, "_tseqs"); INTERN(s_get_tseq, "_get_sequence_number_for_group");
    INTERN(s_p2p_one, "p2p_one");
    INTERN(s_get_future, "get_future"); INTERN(s_add_done_callback, "add_done_callback");
    INTERN(s_acquire, "acquire"); INTERN(s_release, "release"); INTERN(s_notify, "_notify");
    INTERN(s_wake, "wake"); INTERN(s_itemsize, "itemsize"); INTERN(s_dropped, "_dropped");
    INTERN(s_by_storage, "_by_storage"); INTERN(s_pending, "_pending");
    INTERN(s_ready, "_ready"); INTERN(s_pend_lock, "_pend_lock");
    INTERN(s_lazy_idle, "lazy_idle"); INTERN(s_idle_owed, "_idle_owed");
    INTERN(s_polled, "_polled");
    INTERN(s_listeners, "_listeners"); INTERN(s_blocking, "_blocking");
    INTERN(s_config, "config"); INTERN(s_hazards, "hazards"); INTERN(s_off, "off");
    INTERN(s_async_completion, "async_completion"); INTERN(s_wait_s, "wait");
    INTERN(s_name_attr, "__name__"); INTERN(s_append_m, "append");
    INTERN(s_how_callback, "callback"); INTERN(s_how_observed, "observed");
    INTERN(s_how_wait, "wait"); INTERN(s_done, "done"); INTERN(s_is_completed, "is_completed");
    i_zero = PyLong_FromLong(0);
    i_one = PyLong_FromLong(1);
    if (i_zero == NULL || i_one == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL)
        return NULL;
    /* The Python side uses this module only when it expects this API_VERSION (a stale build
     * of an older source is then ignored, not half-used). */
    if (PyModule_AddIntConstant(m, "API_VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CountersType);
    if (PyModule_AddObject(m, "Counters", (PyObject *)&CountersType) < 0) {
        Py_DECREF(&CountersType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&OpIdsType);
    if (PyModule_AddObject(m, "OpIds", (PyObject *)&OpIdsType) < 0) {
        Py_DECREF(&OpIdsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PendLockType);
    if (PyModule_AddObject(m, "PendLock", (PyObject *)&PendLockType) < 0) {
        Py_DECREF(&PendLockType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
