// The autograd mode state of a thread, as a Python value that can be
// captured and swapped in without RAII.
//
// torch.utils._contextlib runs each step of a decorated generator, coroutine
// or async generator with the body's own mode state switched in, and the
// caller's switched back afterwards.  Suspended bodies are resumed in any
// order, so a guard (c10::InferenceMode) cannot do this: it forces the whole
// AutogradState and the whole local dispatch key set back to what it found
// when it is destroyed, dropping whatever else the body or the caller
// changed meanwhile (autocast, Python dispatch modes, dispatch key guards).
//
// The state switched here is what the grad-mode context managers change: the
// thread's c10::AutogradState, and the dispatch key bits that
// c10::InferenceMode toggles (ADInplaceOrView in the included set, the
// autograd keys in the excluded set).  Those bits are switched only when the
// switch turns inference mode on or off: other code excludes the autograd
// keys too (at::AutoDispatchBelowAutograd, around every __torch_dispatch__),
// and that exclusion is not the body's to carry.  Every other bit is left
// alone.
//
// Raw CPython rather than pybind11: a decorated generator makes two of these
// calls per step, and pybind11's dispatch would cost more than the step.

#include <torch/csrc/autograd/python_autograd_mode_state.h>

#include <c10/core/AutogradState.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>

#include <new>

namespace torch::autograd {

namespace {

// See Note [Expected TLS state in InferenceMode] in c10/core/InferenceMode.h.
constexpr c10::DispatchKeySet kInferenceIncluded(
    c10::DispatchKey::ADInplaceOrView);
constexpr c10::DispatchKeySet kInferenceExcluded =
    c10::autograd_dispatch_keyset;

struct AutogradModeState {
  AutogradModeState()
      : autograd(c10::AutogradState::get_tls_state()),
        keys(c10::impl::tls_local_dispatch_key_set()) {}

  c10::AutogradState autograd;
  c10::impl::LocalDispatchKeySet keys;
};

struct THPAutogradModeState {
  PyObject_HEAD
  AutogradModeState state;
};

// AutogradState may hold a Python object, its graph execution group (see
// torch.utils.checkpoint.GraphExecGroup), which may in turn refer to the
// suspended body holding this state: such states take part in cyclic
// garbage collection.  The others, nearly all, are never tracked.
const c10::SafePyObject* graph_exec_group(PyObject* self) {
  const auto& group = reinterpret_cast<THPAutogradModeState*>(self)
                          ->state.autograd.get_graph_exec_group();
  return group ? &*group : nullptr;
}

int THPAutogradModeState_traverse(PyObject* self, visitproc visit, void* arg) {
  if (auto group = graph_exec_group(self)) {
    Py_VISIT(group->ptr(&group->pyinterpreter()));
  }
  return 0;
}

int THPAutogradModeState_clear(PyObject* self) {
  reinterpret_cast<THPAutogradModeState*>(self)
      ->state.autograd.set_graph_exec_group(std::nullopt);
  return 0;
}

void THPAutogradModeState_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  reinterpret_cast<THPAutogradModeState*>(self)->state.~AutogradModeState();
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject THPAutogradModeStateType = {
    PyVarObject_HEAD_INIT(nullptr, 0)
    "torch._C._AutogradModeState", /* tp_name */
    sizeof(THPAutogradModeState), /* tp_basicsize */
    0, /* tp_itemsize */
    THPAutogradModeState_dealloc, /* tp_dealloc */
    0, /* tp_vectorcall_offset */
    nullptr, /* tp_getattr */
    nullptr, /* tp_setattr */
    nullptr, /* tp_reserved */
    nullptr, /* tp_repr */
    nullptr, /* tp_as_number */
    nullptr, /* tp_as_sequence */
    nullptr, /* tp_as_mapping */
    nullptr, /* tp_hash  */
    nullptr, /* tp_call */
    nullptr, /* tp_str */
    nullptr, /* tp_getattro */
    nullptr, /* tp_setattro */
    nullptr, /* tp_as_buffer */
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, /* tp_flags */
    "A thread's AutogradState and the dispatch key bits inference mode "
    "toggles.", /* tp_doc */
    THPAutogradModeState_traverse, /* tp_traverse */
    THPAutogradModeState_clear, /* tp_clear */
};

// Returns a new reference to the calling thread's state.
PyObject* capture() {
  auto self = PyObject_GC_New(THPAutogradModeState, &THPAutogradModeStateType);
  if (!self) {
    return nullptr;
  }
  new (&self->state) AutogradModeState();
  auto object = reinterpret_cast<PyObject*>(self);
  if (graph_exec_group(object)) {
    PyObject_GC_Track(object);
  }
  return object;
}

void install(const AutogradModeState& state) {
  bool toggles_inference_mode = state.autograd.get_inference_mode() !=
      c10::AutogradState::get_tls_state().get_inference_mode();
  c10::AutogradState::set_tls_state(state.autograd);
  if (toggles_inference_mode) {
    auto keys = c10::impl::tls_local_dispatch_key_set();
    keys.included_ = (keys.included_ - kInferenceIncluded) |
        (state.keys.included_ & kInferenceIncluded);
    keys.excluded_ = (keys.excluded_ - kInferenceExcluded) |
        (state.keys.excluded_ & kInferenceExcluded);
    c10::impl::_force_tls_local_dispatch_key_set(keys);
  }
}

PyObject* get_autograd_mode_state(
    PyObject* /*module*/,
    PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  return capture();
  END_HANDLE_TH_ERRORS
}

// Installs ``state`` on the calling thread and returns the state it replaced.
PyObject* swap_autograd_mode_state(PyObject* /*module*/, PyObject* state) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      Py_TYPE(state) == &THPAutogradModeStateType,
      "_swap_autograd_mode_state(): expected a state from "
      "_get_autograd_mode_state(), got ",
      Py_TYPE(state)->tp_name);
  PyObject* previous = capture();
  if (previous) {
    install(reinterpret_cast<THPAutogradModeState*>(state)->state);
  }
  return previous;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"_get_autograd_mode_state",
     get_autograd_mode_state,
     METH_NOARGS,
     "Return the calling thread's autograd mode state."},
    {"_swap_autograd_mode_state",
     swap_autograd_mode_state,
     METH_O,
     "Install an autograd mode state on the calling thread; return the one it "
     "replaced."},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

void init_autograd_mode_state(PyObject* module) {
  if (PyType_Ready(&THPAutogradModeStateType) < 0) {
    throw python_error();
  }
  if (PyModule_AddObjectRef(
          module,
          "_AutogradModeState",
          reinterpret_cast<PyObject*>(&THPAutogradModeStateType)) < 0 ||
      PyModule_AddFunctions(module, methods) < 0) {
    throw python_error();
  }
}

} // namespace torch::autograd
