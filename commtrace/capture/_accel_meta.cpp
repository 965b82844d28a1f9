// The C fast path's per-call reads of torch state through torch's C++ API (issue 20), built
// into the same on-demand module as the C++ DDP hook (accel.py; `commtrace accel build`).
//
// Per recorded call, _fastpath.c reads the tensor's element count, dtype and device (and the
// output's byte size), and for the gap check torch's sequence number of the group. Without
// this module those are torch's Python-level accessors called from C (TensorBase.numel,
// .dtype, .get_device, .nbytes; the pybind method ProcessGroup._get_sequence_number_for_group,
// which also releases and retakes the GIL). Here they are plain C functions over at::Tensor
// and c10d::ProcessGroup, handed to _fastpath as a capsule of function pointers
// (_fastpath.set_meta_api); _fastpath uses them when this module is loaded and the old reads
// otherwise. Nothing is cached: every call reads the tensor and the group afresh.
//
// Each function returns 1 with the values, or 0 ("not handled here": _fastpath then makes the
// Python-level read it made before, which gives the answer torch's accessor gives, error
// included). They return 0, rather than a value that could differ from the accessor's, where
// the accessor would not simply read the tensor: a torch function mode is active (the
// accessors go through it), the JIT tracer is on (numel is traced), the size is symbolic
// (the accessor returns a SymInt). They never leave a Python error set and never throw.

#include <torch/extension.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/frontend/tracer.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace {

// The capsule's layout (_fastpath.c, MetaApi); version 2. All take the GIL held.
struct MetaApi {
  int version;
  // x: a tensor; numel, dtype (a borrowed torch.dtype, as x.dtype), device (x.get_device())
  int (*tensor_meta)(PyObject* x, long long* numel, PyObject** dtype, long long* device);
  // x.nbytes
  int (*tensor_nbytes)(PyObject* x, long long* nbytes);
  // g._get_sequence_number_for_group() for a c10d ProcessGroup (as the pybind method)
  int (*pg_seq)(PyObject* g, long long* seq);
  // Version 2: an async op's completion without Python on the backend's thread (below).
  // work.get_future().add_done_callback(stamp row) for a c10d Work: 1 attached (a reference
  // to row is taken), 0 not handled here (the caller attaches its Python callback)
  int (*work_attach)(PyObject* work, PyObject* row, long long (*now)());
  // work.is_completed() for a c10d Work: 1 with *done, 0 not handled here
  int (*work_done)(PyObject* work, int* done);
  // the stamps queued by the callbacks, written: stamp(row, t, observed) for each (GIL held)
  int (*stamps_flush)(void (*stamp)(PyObject* row, long long t, int observed));
  // the number of stamps queued (any thread; a look before stamps_flush)
  const std::atomic<long long>* stamps_queued;
};
constexpr int kMetaVersion = 2;
constexpr const char* kMetaCapsule = "commtrace.capture.accel.meta_api";

// Whether the accessors would do more than read the tensor (see the top of the file).
inline bool plain_read(PyObject* x) {
  return THPVariable_Check(x) && !at::impl::torch_function_mode_enabled() &&
         !torch::jit::tracer::isTracing();
}

inline void clear_own_error(bool had) {
  if (!had && PyErr_Occurred())
    PyErr_Clear();
}

int tensor_meta(PyObject* x, long long* numel, PyObject** dtype, long long* device) {
  bool had = PyErr_Occurred() != nullptr;
  try {
    if (!plain_read(x)) {
      clear_own_error(had);
      return 0;
    }
    const at::Tensor& t = THPVariable_Unpack(x);
    auto n = t.sym_numel().maybe_as_int();
    if (!n.has_value())
      return 0;
    PyObject* d = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    if (d == nullptr)
      return 0;
    long long dev = t.get_device();
    *numel = *n;
    *dtype = d;
    *device = dev;
    return 1;
  } catch (...) {
    clear_own_error(had);
    return 0;
  }
}

int tensor_nbytes(PyObject* x, long long* nbytes) {
  bool had = PyErr_Occurred() != nullptr;
  try {
    if (!plain_read(x)) {
      clear_own_error(had);
      return 0;
    }
    auto n = THPVariable_Unpack(x).sym_nbytes().maybe_as_int();
    if (!n.has_value())
      return 0;
    *nbytes = *n;
    return 1;
  } catch (...) {
    clear_own_error(had);
    return 0;
  }
}

// torch's ProcessGroup class (pybind's registered type), looked up once.
PyTypeObject* pg_class() {
  static PyTypeObject* t = reinterpret_cast<PyTypeObject*>(
      py::detail::get_type_handle(typeid(c10d::ProcessGroup), false).ptr());
  return t;
}

// The pybind method is ProcessGroup::getSequenceNumberForGroup with the GIL released; called
// here with the GIL held. What it runs for gloo and NCCL reads a counter (gloo's under its own
// mutex, which nothing holds while waiting for the GIL); a backend implemented in Python
// (PyBackend's trampoline) takes the GIL itself, which is held already. Only for groups of
// exactly torch's ProcessGroup class: a subclass (Python or another extension's) may bind the
// method to something else, and is left to the Python-level read.
int pg_seq(PyObject* g, long long* seq) {
  bool had = PyErr_Occurred() != nullptr;
  try {
    PyTypeObject* tp = pg_class();
    if (tp == nullptr || Py_TYPE(g) != tp) {
      clear_own_error(had);
      return 0;
    }
    auto vh = reinterpret_cast<py::detail::instance*>(g)->get_value_and_holder(nullptr, false);
    if (!vh || !vh.holder_constructed())
      return 0;
    auto* pg = static_cast<c10d::ProcessGroup*>(vh.value_ptr());
    if (pg == nullptr)
      return 0;
    *seq = static_cast<long long>(pg->getSequenceNumberForGroup());
    return 1;
  } catch (...) {
    clear_own_error(had);
    return 0;
  }
}

// ---- async completion (version 2) -------------------------------------------------------
// The C path's async ops with a future (gloo's collectives called with async_op=True: an
// async all_reduce, DDP without the C++ hook, user code that overlaps; on torch 2.13 / gloo
// FSDP2 issues its all-gathers and reduce-scatters blocking, so none of this runs for it)
// completed their row through a Python callback (future.add_done_callback): per op a
// get_future() and an add_done_callback() pybind call on the training thread, and on the
// backend's thread the GIL taken to run the callback (while the training thread computes,
// that is a GIL hand-over each way). Here the callback is C++ on the c10 future: on the
// backend's thread it reads the clock and queues (row, time) under a mutex, no GIL; a thread
// holding the GIL writes the queued times into their rows (stamps_flush: the op's wait(), the
// next async call, the writer thread's service). The writer thread releases an op with a
// future only once its row has an end time, and wait() flushes before it completes the row,
// so the rows are the Python callback's. Gloo's p2p Works (isend / irecv) have no future:
// for them only is_completed() is read here (work_done).

// c10d's Work class as pybind registered it, looked up once.
PyTypeObject* work_class() {
  static PyTypeObject* t = reinterpret_cast<PyTypeObject*>(
      py::detail::get_type_handle(typeid(c10d::Work), false).ptr());
  return t;
}

// The c10d::Work of an object of exactly torch's Work class (a Python subclass may override
// get_future or is_completed: left to the Python-level calls), else nullptr.
c10d::Work* work_of(PyObject* w) {
  PyTypeObject* tp = work_class();
  if (tp == nullptr || Py_TYPE(w) != tp)
    return nullptr;
  auto vh = reinterpret_cast<py::detail::instance*>(w)->get_value_and_holder(nullptr, false);
  if (!vh || !vh.holder_constructed())
    return nullptr;
  return static_cast<c10d::Work*>(vh.value_ptr());
}

struct Stamp {
  PyObject* row;   // a reference owned by the stamp, released with the GIL
  long long t;
  bool observed;
};

// Allocated once and never freed: a backend thread may run a callback while the process
// exits, after static destructors.
struct StampQueue {
  std::mutex mu;
  std::vector<Stamp> queued;
  std::atomic<long long> n{0};
};
StampQueue* const stamp_q = new StampQueue();

// Set on the training thread while it attaches: a callback run at once by addCallback (the
// future was complete) runs on it with this set, and is "observed" (an upper bound).
thread_local bool t_attaching = false;

// work_attach's and work_done's common frame: f(*w) for the c10d::Work of `work` (its
// answer: 1 handled, 0 not), 0 for anything but exactly torch's Work or when f throws,
// leaving no Python error of its own set.
template <class F>
int with_work(PyObject* work, F&& f) {
  bool had = PyErr_Occurred() != nullptr;
  try {
    c10d::Work* w = work_of(work);
    if (w != nullptr)
      return f(*w);
  } catch (...) {
  }
  clear_own_error(had);
  return 0;
}

int work_attach(PyObject* work, PyObject* row, long long (*now)()) {
  return with_work(work, [row, now](c10d::Work& w) {
    c10::intrusive_ptr<c10::ivalue::Future> fut = w.getFuture();   // throws: no future
    if (!fut)
      return 0;
    Py_INCREF(row);
    t_attaching = true;
    try {
      fut->addCallback(
          [row, now](c10::ivalue::Future&) {
            Stamp s{row, now(), t_attaching};
            std::lock_guard<std::mutex> g(stamp_q->mu);
            stamp_q->queued.push_back(s);
            stamp_q->n.store(static_cast<long long>(stamp_q->queued.size()),
                             std::memory_order_release);
          },
          /*uses_future=*/false);
    } catch (...) {
      t_attaching = false;
      Py_DECREF(row);
      throw;
    }
    t_attaching = false;
    return 1;
  });
}

int work_done(PyObject* work, int* done) {
  return with_work(work, [done](c10d::Work& w) {
    *done = w.isCompleted() ? 1 : 0;
    return 1;
  });
}

int stamps_flush(void (*stamp)(PyObject* row, long long t, int observed)) {
  if (stamp_q->n.load(std::memory_order_acquire) == 0)
    return 0;
  std::vector<Stamp> got;
  {
    std::lock_guard<std::mutex> g(stamp_q->mu);
    got.swap(stamp_q->queued);
    stamp_q->n.store(0, std::memory_order_release);
  }
  for (auto& s : got) {
    stamp(s.row, s.t, s.observed ? 1 : 0);
    Py_DECREF(s.row);
  }
  return static_cast<int>(got.size());
}

const MetaApi meta_api = {kMetaVersion, tensor_meta, tensor_nbytes, pg_seq,
                          work_attach,  work_done,   stamps_flush, &stamp_q->n};

}  // namespace

// Called from the module's init (_ddp_hook.cpp's PYBIND11_MODULE).
void commtrace_register_meta(py::module_& m) {
  m.attr("META_VERSION") = kMetaVersion;
  m.def(
      "meta_api",
      []() {
        return py::capsule(static_cast<const void*>(&meta_api), kMetaCapsule);
      },
      "Capsule of the tensor / group reads for _fastpath.set_meta_api.");
}
