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
// The state switched here is exactly what the grad-mode context managers
// change: the thread's c10::AutogradState, and the dispatch key bits that
// c10::InferenceMode toggles (ADInplaceOrView in the included set, the
// autograd keys in the excluded set).  Every other bit is left alone.

#include <torch/csrc/autograd/python_autograd_mode_state.h>

#include <c10/core/AutogradState.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>

#include <new>

namespace torch::autograd {

namespace {

// See Note [Expected TLS state in InferenceMode] in c10/core/InferenceMode.h.
constexpr c10::DispatchKeySet kOwnedIncluded(c10::DispatchKey::ADInplaceOrView);
constexpr c10::DispatchKeySet kOwnedExcluded = c10::autograd_dispatch_keyset;

struct THPAutogradModeState {
  PyObject_HEAD
  c10::AutogradState autograd;
  c10::DispatchKeySet included; // the owned bits of the included set
  c10::DispatchKeySet excluded; // the owned bits of the excluded set
};

PyTypeObject THPAutogradModeStateType = {
    PyVarObject_HEAD_INIT(nullptr, 0)
    "torch._C._AutogradModeState", /* tp_name */
    sizeof(THPAutogradModeState), /* tp_basicsize */
};

// Returns a new reference to the calling thread's state.
PyObject* capture() {
  auto self = PyObject_New(THPAutogradModeState, &THPAutogradModeStateType);
  if (!self) {
    return nullptr;
  }
  auto keys = c10::impl::tls_local_dispatch_key_set();
  new (&self->autograd) c10::AutogradState(c10::AutogradState::get_tls_state());
  self->included = keys.included_ & kOwnedIncluded;
  self->excluded = keys.excluded_ & kOwnedExcluded;
  return reinterpret_cast<PyObject*>(self);
}

void install(const THPAutogradModeState* state) {
  c10::AutogradState::set_tls_state(state->autograd);
  auto keys = c10::impl::tls_local_dispatch_key_set();
  keys.included_ = (keys.included_ - kOwnedIncluded) | state->included;
  keys.excluded_ = (keys.excluded_ - kOwnedExcluded) | state->excluded;
  c10::impl::_force_tls_local_dispatch_key_set(keys);
}

void THPAutogradModeState_dealloc(PyObject* self) {
  // AutogradState may hold a Python object (its graph execution group).
  reinterpret_cast<THPAutogradModeState*>(self)->autograd.~AutogradState();
  PyObject_Free(self);
}

PyObject* get_autograd_mode_state(PyObject* /*module*/, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  return capture();
  END_HANDLE_TH_ERRORS
}

// Installs ``state`` on the calling thread and returns the state it replaced.
PyObject* swap_autograd_mode_state(PyObject* /*module*/, PyObject* state) {
  HANDLE_TH_ERRORS
  if (Py_TYPE(state) != &THPAutogradModeStateType) {
    PyErr_Format(
        PyExc_TypeError,
        "_swap_autograd_mode_state(): expected a state from "
        "_get_autograd_mode_state(), got %s",
        Py_TYPE(state)->tp_name);
    return nullptr;
  }
  PyObject* previous = capture();
  if (previous) {
    install(reinterpret_cast<THPAutogradModeState*>(state));
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
     "Install an autograd mode state on the calling thread; return the one it replaced."},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

void init_autograd_mode_state(PyObject* module) {
  THPAutogradModeStateType.tp_dealloc = THPAutogradModeState_dealloc;
  THPAutogradModeStateType.tp_flags = Py_TPFLAGS_DEFAULT;
  THPAutogradModeStateType.tp_doc =
      "A thread's AutogradState and the dispatch key bits inference mode toggles.";
  if (PyType_Ready(&THPAutogradModeStateType) < 0) {
    throw python_error();
  }
  Py_INCREF(&THPAutogradModeStateType);
  if (PyModule_AddObject(
          module,
          "_AutogradModeState",
          reinterpret_cast<PyObject*>(&THPAutogradModeStateType)) < 0) {
    throw python_error();
  }
  if (PyModule_AddFunctions(module, methods) < 0) {
    throw python_error();
  }
}

} // namespace torch::autograd
