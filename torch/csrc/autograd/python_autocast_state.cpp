// A thread's autocast state as a Python value, so that torch.utils._contextlib
// can swap a suspended body's state in around each of its steps and its
// caller's back after each, as python_autograd_mode_state.cpp does for the
// autograd mode state.  Python could read and set it too, at 13-19 us a swap
// for the ten device types.
//
// The state is, for every device type autocast supports, whether autocast is
// enabled and its dtype, then the cache flag and the nesting count.  The cast
// cache is not: it is one map for the process, keyed by the weight, whatever
// the dtype of its cast, and filled under whatever states a step went
// through.  So every swap clears it: no cast crosses from a body to its
// caller, or to another body, in either direction.

#include <torch/csrc/autograd/python_autocast_state.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/Exceptions.h>

#include <array>
#include <type_traits>

namespace torch::autograd {

namespace {

using at::autocast::_AUTOCAST_SUPPORTED_DEVICES;

struct AutocastState {
  std::array<bool, _AUTOCAST_SUPPORTED_DEVICES.size()> enabled{};
  std::array<at::ScalarType, _AUTOCAST_SUPPORTED_DEVICES.size()> dtype{};
  bool cache_enabled = false;
  int nesting = 0;

  static AutocastState current() {
    AutocastState state;
    for (size_t i = 0; i < _AUTOCAST_SUPPORTED_DEVICES.size(); ++i) {
      state.enabled[i] =
          at::autocast::is_autocast_enabled(_AUTOCAST_SUPPORTED_DEVICES[i]);
      state.dtype[i] =
          at::autocast::get_autocast_dtype(_AUTOCAST_SUPPORTED_DEVICES[i]);
    }
    state.cache_enabled = at::autocast::is_autocast_cache_enabled();
    // The count can only be stepped: one step up tells it.
    state.nesting = at::autocast::increment_nesting() - 1;
    at::autocast::decrement_nesting();
    return state;
  }

  // Makes this the thread's state, replacing ``now``.
  void install(const AutocastState& now) const {
    for (size_t i = 0; i < enabled.size(); ++i) {
      at::autocast::set_autocast_enabled(
          _AUTOCAST_SUPPORTED_DEVICES[i], enabled[i]);
      at::autocast::set_autocast_dtype(
          _AUTOCAST_SUPPORTED_DEVICES[i], dtype[i]);
    }
    at::autocast::set_autocast_cache_enabled(cache_enabled);
    // ATen has no setter for the count either: one step at a time.
    for (int n = now.nesting; n < nesting; ++n) {
      at::autocast::increment_nesting();
    }
    for (int n = now.nesting; n > nesting; --n) {
      at::autocast::decrement_nesting();
    }
    at::autocast::clear_cache();
  }
};

// NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
struct THPAutocastState {
  PyObject_HEAD
  AutocastState state;
};

// The type frees its objects with the inherited deallocator.
static_assert(std::is_trivially_destructible_v<AutocastState>);

PyTypeObject THPAutocastStateType = {
    PyVarObject_HEAD_INIT(nullptr, 0)
    "torch._C._AutocastState", /* tp_name */
    sizeof(THPAutocastState), /* tp_basicsize */
    0, /* tp_itemsize */
    nullptr, /* tp_dealloc */
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
    Py_TPFLAGS_DEFAULT, /* tp_flags */
    "A thread's autocast state.", /* tp_doc */
};

// Returns a new reference to the calling thread's state, captured.
PyObject* capture(const AutocastState** out) {
  auto self = PyObject_New(THPAutocastState, &THPAutocastStateType);
  if (!self) {
    return nullptr;
  }
  *out = new (&self->state) AutocastState(AutocastState::current());
  return reinterpret_cast<PyObject*>(self);
}

PyObject* get_autocast_state(PyObject* /*module*/, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  const AutocastState* state = nullptr;
  return capture(&state);
  END_HANDLE_TH_ERRORS
}

// Installs ``state`` and returns the state it replaced.
PyObject* swap_autocast_state(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      Py_TYPE(arg) == &THPAutocastStateType,
      "_swap_autocast_state(): expected a state from _get_autocast_state(), "
      "got ",
      Py_TYPE(arg)->tp_name);
  const AutocastState* now = nullptr;
  PyObject* previous = capture(&now);
  if (previous) {
    reinterpret_cast<THPAutocastState*>(arg)->state.install(*now);
  }
  return previous;
  END_HANDLE_TH_ERRORS
}

// NOLINTNEXTLINE(*-avoid-c-arrays)
PyMethodDef methods[] = {
    {"_get_autocast_state",
     get_autocast_state,
     METH_NOARGS,
     "Return the calling thread's autocast state."},
    {"_swap_autocast_state",
     swap_autocast_state,
     METH_O,
     "Install an autocast state; return the one it replaced."},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

void init_autocast_state(PyObject* module) {
  if (PyType_Ready(&THPAutocastStateType) < 0) {
    throw python_error();
  }
  if (PyModule_AddObjectRef(
          module,
          "_AutocastState",
          reinterpret_cast<PyObject*>(&THPAutocastStateType)) < 0 ||
      PyModule_AddFunctions(module, methods) < 0) {
    throw python_error();
  }
}

} // namespace torch::autograd
