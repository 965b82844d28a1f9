// commtrace's DDP comm hook in C++ (issue 20; docs/performance.md, "DDP's comm hook in C++").
//
// A hook registered from Python (even commtrace's C one, _fastpath.ddp_hook) runs through
// torch's PythonCommHook: per bucket the Reducer takes the GIL to call it, the `.then`
// continuation takes the GIL on the backend's thread, and the Reducer takes it a third time to
// read the result (the future's value is a PyObject). This hook is a c10d::CommHookInterface
// of its own, registered on the C++ Reducer behind `ddp.reducer`:
//   - runHook takes the GIL once per bucket and hands the bucket to _fastpath's ddp_issue (a
//     capsule of C function pointers, so that the row is the C path's, field for field), which
//     scales the bucket as DDP does and issues its all_reduce, recorded;
//   - the continuation, on the backend's thread, takes no GIL: it reads the clock and queues
//     (row, time) in a list under a mutex, and returns the bucket as a tensor (with interface
//     v2 the bucket is a C record of _fastpath's, session 30: the continuation stores the time
//     into it, and the writer thread builds its row; see _fastpath.c "DDP's buckets as C
//     records");
//   - parseHookResult (the training thread, after DDP has waited for the bucket) takes the
//     GIL only when stamps are queued, and writes them into their rows (as_complete: the
//     writer thread releases an op with a future only once its row has an end time, so a
//     stamp written here rather than on the backend's thread changes no row); so do the next
//     runHook and the writer thread's service (flush_all), whichever comes first.
// Anything ddp_issue does not take (a hook of the user's, tracing off, a CUDA bucket, ...)
// goes to the Python dispatcher (ddp._dispatch) as through PythonCommHook.
//
// Hook interface v2: where the model's group is torch's ProcessGroup class itself on gloo or
// NCCL (ddp.py _v2_group), the bucket's scaling (DDP's `mul_(1 / world size)`, or `div_`) and
// its all_reduce are done here through ATen and c10d's C++ API (ProcessGroup::allreduce, as
// torch's builtin C++ comm hooks call it, with the GIL released as the pybind binding releases
// it), handed to ddp_issue as a DdpIssuer: no Python method call, no pybind call of
// ProcessGroup.allreduce or Work.get_future per bucket. The record is ddp_issue's as before:
// all_reduce's FastCtx stamps enqueue and return around issue_ar, and the Work it tracks is
// the same Work, as a Python object -- or, where its completion is this side's callback (the
// default), no Python object at all: issue_ar_nopy, the pending op without a Work (session 21).
// Elsewhere (another group class or backend, a torch function mode on, COMMTRACE_DDP_V2=0) the
// v1 path: ddp_issue's Python calls.
//
// Built on demand against the installed torch (commtrace/capture/accel.py), never at pip
// install time: torch is not a build dependency of commtrace.

#include <torch/extension.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

// _fastpath.c's DdpIssuer: this side's scaling and all_reduce (interface v2). GIL held.
struct DdpIssuer {
  PyObject* group;
  void* ctx;
  int (*scale)(void* ctx, int div, double f, long long i);
  PyObject* (*issue_ar)(void* ctx);
  // the same all_reduce without its Work as a Python object (the C path's pending op takes
  // none: the Work is this side's, its completion stamped by Pending): 0, or -1 with a Python
  // exception set
  int (*issue_ar_nopy)(void* ctx);
};

// _fastpath.c's DdpTicket: one bucket between direct_pre and direct_post (opaque here).
struct DdpTicket {
  void* d;
  PyObject* rec;
  PyObject* tkey;
  PyObject* tname;
  long long tslot, op_id, seq;
};

// The capsule's layout (_fastpath.c, DdpCxxApi); version 5 (4: no direct_pre / direct_post;
// 3: no C records, issue_dr; 2: DdpIssuer had no issue_ar_nopy).
struct DdpCxxApi {
  int version;
  int (*issue)(PyObject* state, PyObject* buf, PyObject* idx, PyObject* detail_arg,
               DdpIssuer* iss, PyObject** work, PyObject** row, PyObject** fut);
  void (*stamp)(PyObject* row, long long t, int observed);
  long long (*now)();
  // issue, where the caller takes a C record of the bucket (*dr, _fastpath's DRec) when one
  // is made: then *row is NULL; the caller attaches dr_stamp to the Work's future (any
  // thread, no GIL: the completion time) and calls dr_attached after the attach (session 30)
  int (*issue_dr)(PyObject* state, PyObject* buf, PyObject* idx, PyObject* detail_arg,
                  DdpIssuer* iss, PyObject** work, PyObject** row, PyObject** fut, void** dr);
  void (*dr_stamp)(void* dr, long long t);
  void (*dr_attached)(void* dr);
  // the recording group's bucket recorded without a Python call (session 30): direct_pre
  // (GIL held) returns 1 when it took the bucket (its record begun, *tk filled), else 0
  // (nothing done: issue_dr); the caller issues the all-reduce itself, then direct_post (GIL
  // held; issued 0 with the all-reduce's error set as the Python exception) returns the C
  // record to attach dr_stamp to, or NULL
  int (*direct_pre)(PyObject* state, PyObject* group, long long idx, long long numel,
                    PyObject* dtype, DdpTicket* tk);
  void* (*direct_post)(DdpTicket* tk, int issued);
};
constexpr int kApiVersion = 5;
constexpr const char* kCapsule = "commtrace.capture._fastpath.ddp_cxx_api";

// Completion stamps queued by the continuations (any thread) until a thread holding the GIL
// writes them into their rows. Shared with the continuations, which may outlive the hook.
struct Stamps {
  explicit Stamps(const DdpCxxApi* a) : api(a) {}
  const DdpCxxApi* api;
  struct Stamp {
    PyObject* row;   // a reference owned by the stamp, released with the GIL
    long long t;
    bool observed;
  };
  std::mutex mu;
  std::vector<Stamp> queued;
  std::atomic<size_t> n{0};

  // The last reference may be a continuation's or a recording group's callback that ran after
  // its hook or group was freed (a Work's future wakes its waiters before it runs callbacks, so
  // the training thread can free DDP first): write what it queued, or the row keeps no end.
  ~Stamps() {
    if (queued.empty() || !Py_IsInitialized() || finalizing())
      return;   // (interpreter gone: leak the rows rather than touch it)
    py::gil_scoped_acquire gil;
    for (auto& s : queued) {
      api->stamp(s.row, s.t, s.observed ? 1 : 0);
      Py_DECREF(s.row);
    }
  }

  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }

  void push(PyObject* row, long long t, bool observed) {
    std::lock_guard<std::mutex> g(mu);
    queued.push_back({row, t, observed});
    n.store(queued.size(), std::memory_order_release);
  }

  // The GIL is held.
  void flush() {
    if (n.load(std::memory_order_acquire) == 0)
      return;
    std::vector<Stamp> got;
    {
      std::lock_guard<std::mutex> g(mu);
      got.swap(queued);
      n.store(0, std::memory_order_release);
    }
    for (auto& s : got) {
      api->stamp(s.row, s.t, s.observed ? 1 : 0);
      Py_DECREF(s.row);
    }
  }
};

// Every hook's stamps, for flush_all (the writer thread's service: stamps of buckets whose
// result DDP does not read through parseHookResult, e.g. the shadow all-reduces of DDP's join
// mode, are written within a service period, and before the rows are written at close).
std::mutex registry_mu;
std::vector<std::weak_ptr<Stamps>> registry;

void flush_all() {   // the GIL is held (called from Python)
  std::vector<std::shared_ptr<Stamps>> live;
  {
    std::lock_guard<std::mutex> g(registry_mu);
    std::vector<std::weak_ptr<Stamps>> kept;
    for (auto& w : registry) {
      if (auto s = w.lock()) {
        live.push_back(s);
        kept.push_back(w);
      }
    }
    registry.swap(kept);
  }
  for (auto& s : live)
    s->flush();
}

// What a hook and a recording group both hold: the Python objects ddp_issue and the fallback
// take (the state, the fallback, and the group: the v2 group or the model's), released with
// the GIL (leaked once the interpreter is gone), and the stamps, registered for flush_all and
// written before the objects go.
struct Shared {
  Shared(py::object state_, py::object fallback_, py::object group_, const DdpCxxApi* api_)
      : state(std::move(state_)), fallback(std::move(fallback_)), group(std::move(group_)),
        api(api_), stamps(std::make_shared<Stamps>(api_)) {
    std::lock_guard<std::mutex> g(registry_mu);
    registry.push_back(stamps);
  }

  ~Shared() {
    if (!Py_IsInitialized()) {
      // interpreter gone: leak the references rather than touch it
      state.release();
      fallback.release();
      group.release();
      return;
    }
    py::gil_scoped_acquire gil;
    stamps->flush();
    state = py::object();
    fallback = py::object();
    group = py::object();
  }

  py::object state;
  py::object fallback;
  py::object group;
  const DdpCxxApi* api;
  std::shared_ptr<Stamps> stamps;
};

// One issued bucket's completion stamp, for its Work's future's callback (any thread, no GIL).
struct Pending {
  Pending(PyObject* r, const Shared& s)
      : row(r), issuer(std::this_thread::get_id()), stamps(s.stamps), now(s.api->now) {}
  PyObject* row;   // moved to Stamps on completion
  std::thread::id issuer;
  std::atomic<bool> attaching{true};
  std::shared_ptr<Stamps> stamps;
  long long (*now)();

  void stamp() {
    long long t = now();
    if (row != nullptr) {
      bool observed = attaching.load(std::memory_order_acquire) &&
                      std::this_thread::get_id() == issuer;
      stamps->push(row, t, observed);
      row = nullptr;
    }
  }
};

// AllreduceOptions as torch's Python all_reduce builds them for an async SUM (ddp.py passes
// the same to ProcessGroup.allreduce on the v1 path): asyncOp where this torch has it.
template <typename O>
auto set_async(O& o, int) -> decltype(o.asyncOp = true, void()) {
  o.asyncOp = true;
}
template <typename O>
void set_async(O&, long) {}

c10d::AllreduceOptions sum_async_opts() {
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  set_async(o, 0);
  return o;
}

// The factor of a bucket's mul_ as a 0-dim tensor of the bucket's dtype, kept per hook (float32
// and float64 buckets; the GIL, held by every caller, guards it). `buf.mul_(1 / n)` with a
// Python float -- what DDP's own copy does too -- wraps the double in a new 0-dim double tensor
// and casts it to the bucket's dtype (at::_to_copy) in TensorIterator's type computation on
// every call: about 7k of the 15k instructions mul_ spends outside its kernel per bucket
// (callgrind, docs/performance.md "Session 14 ... DDP step"). The kernel reads the factor as
// opmath_t (float for float32, double for float64) either way: from the double, converted with
// static_cast, or from this tensor, which holds static_cast<dtype>(f) -- the same value, so the
// products are the same bits (tests/test_ddp_numerics.py, 1/3 at 3 ranks). Other dtypes (half,
// bfloat16: opmath float, read from the double) keep the Scalar call.
struct ScaleCache {
  double f32_of = 0.0, f64_of = 0.0;
  at::Tensor f32, f64;

  const at::Tensor* get(const at::Tensor& buf, double f) {
    auto dt = buf.scalar_type();
    if (dt == at::kFloat) {
      if (!f32.defined() || f32_of != f) {
        f32 = at::scalar_tensor(c10::Scalar(f), at::TensorOptions().dtype(at::kFloat));
        f32_of = f;
      }
      return &f32;
    }
    if (dt == at::kDouble) {
      if (!f64.defined() || f64_of != f) {
        f64 = at::scalar_tensor(c10::Scalar(f), at::TensorOptions().dtype(at::kDouble));
        f64_of = f;
      }
      return &f64;
    }
    return nullptr;
  }
};

// One bucket's v2 issue (runHook's stack): what the callbacks work on.
struct V2Call {
  at::Tensor buf;
  c10d::ProcessGroup* pg;
  const c10d::AllreduceOptions* opts;
  ScaleCache* scales;
  c10::intrusive_ptr<c10d::Work> work;   // set by issue_ar
};

int v2_scale(void* ctx, int div, double f, long long i) {
  auto* c = static_cast<V2Call*>(ctx);
  HANDLE_TH_ERRORS
  // the scalar as the Python call passes it: a float to mul_, an int to div_
  if (div) {
    c->buf.div_(c10::Scalar(static_cast<int64_t>(i)));
  } else {
    const at::Tensor* t = c->buf.is_cpu() ? c->scales->get(c->buf, f) : nullptr;
    if (t != nullptr)
      c->buf.mul_(*t);
    else
      c->buf.mul_(c10::Scalar(f));
  }
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

PyObject* v2_issue_ar(void* ctx) {
  auto* c = static_cast<V2Call*>(ctx);
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> ts{c->buf};
  {
    py::gil_scoped_release nogil;   // as the pybind binding of ProcessGroup.allreduce
    c->work = c->pg->allreduce(ts, *c->opts);
  }
  return py::cast(c->work).release().ptr();
  END_HANDLE_TH_ERRORS
}

// v2_issue_ar without the pybind cast: the Work stays a C++ object (c->work). Used when the
// C path's pending op needs no Python Work (its completion stamped by Pending, its Work never
// waited from Python): the cast and the wrapper's free were ~1.6k instructions per bucket.
int v2_issue_ar_nopy(void* ctx) {
  auto* c = static_cast<V2Call*>(ctx);
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> ts{c->buf};
  {
    py::gil_scoped_release nogil;   // as the pybind binding of ProcessGroup.allreduce
    c->work = c->pg->allreduce(ts, *c->opts);
  }
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

std::atomic<unsigned long long> n_v2{0}, n_v1{0}, n_hook_dr{0};

// The Work of a bucket ddp_issue issued (`work`, a new reference, is consumed): the one issued
// here (v2: the Python object is the same Work, or _fastpath's placeholder where no Python
// Work was made: v2_issue_ar_nopy), or the Python object's (v1). A Python object
// that is no Work throws, after dropping the row's reference.
c10::intrusive_ptr<c10d::Work> issued_work(V2Call& call, PyObject* work, PyObject* row) {
  if (call.work) {
    Py_XDECREF(work);
    return std::move(call.work);
  }
  try {
    return py::reinterpret_steal<py::object>(work).cast<c10::intrusive_ptr<c10d::Work>>();
  } catch (...) {
    Py_XDECREF(row);
    throw;
  }
}

at::Tensor first_tensor(const c10::IValue& v) {
  if (v.isTensor())
    return v.toTensor();
  if (v.isTensorList())
    return v.toTensorList().get(0);
  TORCH_CHECK(false, "commtrace DDP hook: unexpected all_reduce result ", v.tagKind());
}

class CommtraceHook : public c10d::CommHookInterface {
 public:
  CommtraceHook(py::object state, py::object fallback, const DdpCxxApi* api,
                py::object v2_group)
      : pg_(v2_group.is_none() ? c10::intrusive_ptr<c10d::ProcessGroup>()
                               : v2_group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>()),
        sh_(std::move(state), std::move(fallback),
            v2_group.is_none() ? py::object() : std::move(v2_group), api),
        opts_(sum_async_opts()) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    py::gil_scoped_acquire gil;
    sh_.stamps->flush();
    PyObject* buf = THPVariable_Wrap(bucket.getBufferRef());
    if (buf == nullptr)
      throw python_error();
    PyObject* idx = PyLong_FromSize_t(bucket.getIndex());
    if (idx == nullptr) {
      Py_DECREF(buf);
      throw python_error();
    }
    PyObject *work = nullptr, *row = nullptr, *pyfut = nullptr;
    V2Call call;
    DdpIssuer iss{sh_.group.ptr(), &call, v2_scale, v2_issue_ar, v2_issue_ar_nopy};
    // v2 unless a torch function mode is on (the Python calls would go through it)
    bool v2 = pg_ && !at::impl::torch_function_mode_enabled();
    if (v2) {
      call.buf = bucket.getBufferRef();
      call.pg = pg_.get();
      call.opts = &opts_;
      call.scales = &scales_;
    }
    // v2: the bucket as a C record where _fastpath makes one (its completion stamped by the
    // continuation below); v1 issues through Python's calls: a pending op, as before
    void* dr = nullptr;
    int r = v2 ? sh_.api->issue_dr(sh_.state.ptr(), buf, idx, idx, &iss, &work, &row, &pyfut, &dr)
               : sh_.api->issue(sh_.state.ptr(), buf, idx, idx, nullptr, &work, &row, &pyfut);
    Py_DECREF(buf);
    Py_DECREF(idx);
    Py_XDECREF(pyfut);
    if (r < 0) {
      Py_XDECREF(row);
      throw python_error();
    }
    if (r == 0)
      return run_fallback(bucket);
    (call.work ? n_v2 : n_v1).fetch_add(1, std::memory_order_relaxed);
    auto w = issued_work(call, work, row);
    auto fut = w->getFuture();
    if (dr != nullptr) {
      const DdpCxxApi* api = sh_.api;
      auto child = fut->then(
          [dr, api](c10::ivalue::Future& f) -> c10::IValue {
            api->dr_stamp(dr, api->now());
            return first_tensor(f.value());   // rethrows the all_reduce's error, if any
          },
          c10::TensorType::get());
      api->dr_attached(dr);
      n_hook_dr.fetch_add(1, std::memory_order_relaxed);
      return child;
    }
    auto p = std::make_shared<Pending>(row, sh_);
    auto child = fut->then(
        [p](c10::ivalue::Future& f) -> c10::IValue {
          p->stamp();
          return first_tensor(f.value());   // rethrows the all_reduce's error, if any
        },
        c10::TensorType::get());
    p->attaching.store(false, std::memory_order_release);
    return child;
  }

  at::Tensor parseHookResult(const c10::IValue& result) override {
    if (sh_.stamps->n.load(std::memory_order_acquire) != 0) {
      py::gil_scoped_acquire gil;
      sh_.stamps->flush();
    }
    if (result.isPyObject()) {
      // a future of the Python dispatcher's: its value is a Python object
      py::gil_scoped_acquire gil;
      py::object obj = torch::jit::toPyObject(result);
      return torch::jit::toIValue(obj, c10::TensorType::get()).toTensor();
    }
    return first_tensor(result);
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> run_fallback(c10d::GradBucket& bucket) {
    // GIL held (runHook)
    py::object ret = sh_.fallback(sh_.state, bucket);
    return ret.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;   // null: v1 (ddp_issue's Python calls)
  Shared sh_;                                   // group: the v2 group (None: v1)
  c10d::AllreduceOptions opts_;
  ScaleCache scales_;                           // v2's mul_ factors (v2_scale)
};

// ---------------------------------------------------------------------------------------
// The group route (ddp.py _install_group): DDP's own all-reduce recorded without a comm hook.
//
// Any comm hook costs a pass over every bucket: with a hook registered the Reducer copies each
// gradient into its bucket unscaled and the hook must scale the bucket (DDP without a hook
// multiplies while copying, one pass). Instead of a hook, the model's Reducer is handed this
// group (Reducer._update_process_group): a c10d::ProcessGroup that shares the model's group's
// backends and forwards every call to it, except allreduce, which it records. So the Reducer
// keeps comm_hook_ == nullptr: it scales as it copies, reads the Work's future itself, and
// DDP's logging data shows no hook. A bucket's allreduce is recorded by _fastpath's ddp_issue,
// as the C++ hook's (the same row, api "ddp_comm_hook", detail naming the bucket), with a scale
// step that does nothing (the Reducer has scaled) and the all_reduce issued on the model's
// group in C++ (the v2 issuer). The bucket's index is not passed to allreduce: the Reducer
// launches its buckets in index order, so this group counts them from the model's forward
// (GroupControl.reset, ddp.py's forward), and a bucket that Python hands to the Reducer
// (Reducer._run_comm_hook: DDP's join mode) names its index first (GroupControl.hint). Its
// completion is stamped by a callback on the Work's future, without the GIL, queued as the C++
// hook's continuations queue theirs. Other tensors (the int32 map of used parameters under
// find_unused_parameters) go to the model's group unrecorded, as without this group; a bucket
// ddp_issue does not take (tracing off, a CUDA or complex bucket, the C path off) goes to
// ddp._group_fallback, which records it through Python's all_reduce or hands it back.

class RecordingGroup : public c10d::ProcessGroup {
 public:
  RecordingGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner, py::object py_inner,
                 py::object state, py::object fallback, const DdpCxxApi* api)
      : c10d::ProcessGroup(inner->getRank(), inner->getSize()), inner_(std::move(inner)),
        sh_(std::move(state), std::move(fallback), std::move(py_inner), api) {
    auto bound = inner_->getBoundDeviceId();
    if (bound)
      setBoundDeviceId(bound);
    // the same backend objects (sequence numbers, flight recorder, connections): the calls not
    // forwarded below reach them through c10d's dispatcher ops with this group as argument
    for (const auto& dev : inner_->getDeviceTypes()) {
      auto b = inner_->getBackend(dev.type());
      setBackend(dev.type(), c10d::ProcessGroup::strToBackendType(b->getBackendName()), b);
    }
    setDefaultBackend(inner_->getBackendType());
  }

  const std::string getBackendName() const override {
    return inner_->getBackendName();
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return inner_->broadcast(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() != 1 || opts.reduceOp.op_ != c10d::ReduceOp::SUM ||
        opts.sparseIndices.has_value() || !tensors[0].defined() || tensors[0].is_sparse() ||
        !(at::isFloatingType(tensors[0].scalar_type()) ||
          at::isComplexType(tensors[0].scalar_type())) ||
        !Py_IsInitialized())
      return inner_->allreduce(tensors, opts);
    py::gil_scoped_acquire gil;
    sh_.stamps->flush();
    long long i = hint_ >= 0 ? hint_ : next_++;
    hint_ = -1;
    {
      // the bucket recorded without a Python call where _fastpath has every fact cached
      // (direct_pre); else the ctx route below
      DdpTicket tk;
      const at::Tensor& t = tensors[0];
      if (t.is_cpu() &&
          sh_.api->direct_pre(sh_.state.ptr(), sh_.group.ptr(), i, t.numel(),
                              reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())),
                              &tk) == 1) {
        c10::intrusive_ptr<c10d::Work> w;
        try {
          py::gil_scoped_release nogil;
          if (test_fail_issues.load(std::memory_order_relaxed) > 0 &&
              test_fail_issues.fetch_sub(1, std::memory_order_relaxed) > 0)
            TORCH_CHECK(false, "the all-reduce's issue failed (commtrace's test injection)");
          w = inner_->allreduce(tensors, opts);
        } catch (...) {
          auto ep = std::current_exception();
          torch::translate_exception_to_python(ep);
          sh_.api->direct_post(&tk, 0);
          std::rethrow_exception(ep);
        }
        n_group.fetch_add(1, std::memory_order_relaxed);
        n_group_direct.fetch_add(1, std::memory_order_relaxed);
        attach_record(*w, sh_.api->direct_post(&tk, 1));
        return w;
      }
    }
    PyObject* buf = THPVariable_Wrap(tensors[0]);
    if (buf == nullptr)
      throw python_error();
    PyObject* idx = PyLong_FromLongLong(i);
    if (idx == nullptr) {
      Py_DECREF(buf);
      throw python_error();
    }
    V2Call call;
    call.buf = tensors[0];
    call.pg = inner_.get();
    call.opts = &opts;
    call.scales = nullptr;
    DdpIssuer iss{sh_.group.ptr(), &call, keep_scale, v2_issue_ar, v2_issue_ar_nopy};
    PyObject *work = nullptr, *row = nullptr, *pyfut = nullptr;
    void* dr = nullptr;
    int r = sh_.api->issue_dr(sh_.state.ptr(), buf, idx, idx, &iss, &work, &row, &pyfut, &dr);
    Py_XDECREF(pyfut);
    if (r == 0) {
      PyObject* w = PyObject_CallFunctionObjArgs(sh_.fallback.ptr(), sh_.group.ptr(), buf, idx,
                                                 nullptr);
      Py_DECREF(buf);
      Py_DECREF(idx);
      if (w == nullptr)
        throw python_error();   // the all_reduce's own error, as without commtrace
      n_group_py.fetch_add(1, std::memory_order_relaxed);
      if (w == Py_None) {
        Py_DECREF(w);
        py::gil_scoped_release nogil;
        return inner_->allreduce(tensors, opts);
      }
      return py::reinterpret_steal<py::object>(w).cast<c10::intrusive_ptr<c10d::Work>>();
    }
    Py_DECREF(buf);
    Py_DECREF(idx);
    if (r < 0) {
      Py_XDECREF(row);
      Py_XDECREF(work);
      throw python_error();
    }
    auto w = issued_work(call, work, row);
    n_group.fetch_add(1, std::memory_order_relaxed);
    if (dr != nullptr) {
      attach_record(*w, dr);
    } else if (row != nullptr) {
      auto p = std::make_shared<Pending>(row, sh_);
      w->getFuture()->addCallback([p](c10::ivalue::Future&) { p->stamp(); });
      p->attaching.store(false, std::memory_order_release);
    }
    return w;
  }

  // GIL held (Python calls): the forward starts the bucket count again; flushes the stamps
  void reset() {
    next_ = 0;
    hint_ = -1;
    sh_.stamps->flush();
  }
  void hint(long long i) { hint_ = i; }
  void flush() { sh_.stamps->flush(); }

  static std::atomic<unsigned long long> n_group, n_group_py, n_group_dr, n_group_direct;
  // Tests only (_test_fail_issues): the next this many buckets of the route without a Python
  // call fail at their issue as an all-reduce that throws there does (c10::Error), so that
  // route's error path runs on a real job (gloo gives no way to make the Reducer's issue
  // throw). 0, the default: never.
  static std::atomic<long long> test_fail_issues;

 private:
  // the Reducer scaled the gradients as it copied them into the bucket: nothing to do
  static int keep_scale(void*, int, double, long long) { return 0; }

  // A bucket's C record (dr, or nullptr: none): its completion time from the Work's future,
  // on the backend's thread, without the GIL (or at once, "observed", where the op has ended
  // already). GIL held.
  void attach_record(c10d::Work& w, void* dr) {
    if (dr == nullptr)
      return;
    const DdpCxxApi* api = sh_.api;
    w.getFuture()->addCallback([dr, api](c10::ivalue::Future&) { api->dr_stamp(dr, api->now()); });
    api->dr_attached(dr);
    n_group_dr.fetch_add(1, std::memory_order_relaxed);
  }

  c10::intrusive_ptr<c10d::ProcessGroup> inner_;
  Shared sh_;            // group: the model's group as a Python object
  long long next_ = 0;   // the GIL guards both
  long long hint_ = -1;
};

std::atomic<unsigned long long> RecordingGroup::n_group{0}, RecordingGroup::n_group_py{0},
    RecordingGroup::n_group_dr{0}, RecordingGroup::n_group_direct{0};
std::atomic<long long> RecordingGroup::test_fail_issues{0};

// What Python keeps of a recording group: its reset and hint (ddp.py).
struct GroupControl {
  c10::intrusive_ptr<RecordingGroup> g;
};

// GroupControl.reset as a plain C function (GroupControl.reset_fn, ddp.py's forward calls it
// once per forward): a METH_NOARGS builtin whose self is a capsule holding a reference to the
// group, called without pybind's dispatch (the argument loader, the instance lookup of
// `self`, the bound method: ~1k instructions per forward, docs/performance.md session 16).
constexpr const char* kGroupCapsule = "commtrace.ddp_recording_group";

PyObject* group_reset_c(PyObject* self, PyObject*) {
  auto* g = static_cast<RecordingGroup*>(PyCapsule_GetPointer(self, kGroupCapsule));
  if (g == nullptr)
    return nullptr;
  g->reset();
  Py_RETURN_NONE;
}

PyMethodDef group_reset_def = {"reset", group_reset_c, METH_NOARGS,
                               "A forward: the next bucket is bucket 0 (GroupControl.reset)."};

void group_capsule_free(PyObject* cap) {
  auto* g = static_cast<RecordingGroup*>(PyCapsule_GetPointer(cap, kGroupCapsule));
  if (g != nullptr)
    c10::raw::intrusive_ptr::decref(static_cast<c10d::ProcessGroup*>(g));
  else
    PyErr_Clear();
}

py::object group_reset_fn(const GroupControl& c) {
  RecordingGroup* g = c.g.get();
  c10::raw::intrusive_ptr::incref(static_cast<c10d::ProcessGroup*>(g));
  PyObject* cap = PyCapsule_New(g, kGroupCapsule, group_capsule_free);
  if (cap == nullptr) {
    c10::raw::intrusive_ptr::decref(static_cast<c10d::ProcessGroup*>(g));
    throw python_error();
  }
  PyObject* fn = PyCFunction_New(&group_reset_def, cap);
  Py_DECREF(cap);
  if (fn == nullptr)
    throw python_error();
  return py::reinterpret_steal<py::object>(fn);
}

// wrap_group(group, state, fallback, capsule) -> (recording group, GroupControl)
py::tuple wrap_group(py::object group, py::object state, py::object fallback,
                     py::capsule api_capsule) {
  if (std::string(api_capsule.name()) != kCapsule)
    throw std::invalid_argument("commtrace DDP group: not _fastpath's capsule");
  auto* api = static_cast<const DdpCxxApi*>(api_capsule.get_pointer());
  if (api == nullptr || api->version != kApiVersion)
    throw std::invalid_argument("commtrace DDP group: _fastpath's capsule has another version");
  auto inner = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  auto g = c10::make_intrusive<RecordingGroup>(inner, group, std::move(state),
                                               std::move(fallback), api);
  c10::intrusive_ptr<c10d::ProcessGroup> base = g;
  return py::make_tuple(py::cast(base), GroupControl{g});
}

// register(reducer, state, fallback, capsule, v2_group=None): register the hook on a DDP
// model's Reducer (raises as Reducer::register_comm_hook does when the model has a hook
// already); v2_group: the group the hook issues on through c10d's C++ API (interface v2), or
// None (v1).
void register_hook(py::object reducer, py::object state, py::object fallback,
                   py::capsule api_capsule, py::object v2_group) {
  if (std::string(api_capsule.name()) != kCapsule)
    throw std::invalid_argument("commtrace DDP hook: not _fastpath's capsule");
  auto* api = static_cast<const DdpCxxApi*>(api_capsule.get_pointer());
  if (api == nullptr || api->version != kApiVersion)
    throw std::invalid_argument("commtrace DDP hook: _fastpath's capsule has another version");
  c10d::Reducer& r = reducer.cast<c10d::Reducer&>();
  r.register_comm_hook(std::make_unique<CommtraceHook>(std::move(state), std::move(fallback), api,
                                                       std::move(v2_group)));
}

}  // namespace

void commtrace_register_meta(py::module_& m);   // _accel_meta.cpp: _fastpath's tensor/group reads

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "commtrace's DDP comm hook in C++ (built against the installed torch)";
  m.attr("API_VERSION") = kApiVersion;
  m.def("register", &register_hook, "register(reducer, state, fallback, capsule, v2_group=None)",
        py::arg("reducer"), py::arg("state"), py::arg("fallback"), py::arg("capsule"),
        py::arg("v2_group") = py::none());
  m.def(
      "counts",
      []() { return py::make_tuple(n_v2.load(), n_v1.load()); },
      "(buckets issued through c10d's C++ API (v2), through Python's calls (v1)).");
  py::class_<GroupControl>(m, "GroupControl")
      .def("reset", [](GroupControl& c) { c.g->reset(); },
           "A forward: the next bucket is bucket 0; writes the queued completion times.")
      .def("hint", [](GroupControl& c, long long i) { c.g->hint(i); },
           "The next bucket's index (a bucket Python hands to the Reducer).")
      .def("flush", [](GroupControl& c) { c.g->flush(); })
      .def_property_readonly("reset_fn", &group_reset_fn,
                             "reset as a plain C function (no pybind dispatch per call).");
  m.def("wrap_group", &wrap_group, "wrap_group(group, state, fallback, capsule)",
        py::arg("group"), py::arg("state"), py::arg("fallback"), py::arg("capsule"));
  m.def(
      "group_counts",
      []() {
        return py::make_tuple(RecordingGroup::n_group.load(), RecordingGroup::n_group_py.load());
      },
      "(buckets recorded by recording groups through the C path, handed to Python).");
  m.def(
      "group_dr_count", []() { return RecordingGroup::n_group_dr.load(); },
      "buckets recorded by recording groups as C records (_fastpath.ddp_direct).");
  m.def(
      "hook_dr_count", []() { return n_hook_dr.load(); },
      "buckets the C++ hook recorded as C records (_fastpath.ddp_direct).");
  m.def(
      "group_direct_count", []() { return RecordingGroup::n_group_direct.load(); },
      "buckets recorded by recording groups without a Python call (direct_pre).");
  m.def(
      "_test_fail_issues",
      [](long long n) { return RecordingGroup::test_fail_issues.exchange(n); },
      "Tests only: the next n buckets recorded without a Python call fail at their issue "
      "(c10::Error); returns the count before.",
      py::arg("n"));
  m.def("flush_all", &flush_all,
        "Write the completion times queued by every hook's continuations into their rows.");
  commtrace_register_meta(m);
}
