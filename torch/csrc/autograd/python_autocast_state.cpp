// A thread's autocast state for one device type as a Python value, so that
// torch.utils._contextlib can swap a suspended body's state in around each of
// its steps and its caller's back after each, as python_autograd_mode_state.cpp
// does for the autograd mode state.  One device type: the decorator's, whose
// ``with`` block sets it; the body sees the others as its caller sets them.
//
// The state is that device type's enabled flag and dtype, the cache flag and
// the nesting count.  The cast cache is not: it is one map for the process,
// keyed by the weight, whatever the dtype of its cast, and filled under
// whatever states a step went through.  So every swap clears it: no cast
// crosses from a body to its caller, or to another body, in either direction.

#include <torch/csrc/autograd/python_autocast_state.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/python_strings.h>

#include <algorithm>
#include <type_traits>

namespace torch::autograd {

namespace {

struct AutocastState {
  at::DeviceType device_type{};
  bool enabled = false;
  at::ScalarType dtype{};
  bool cache_enabled = false;
  int nesting = 0;

  static AutocastState current(at::DeviceType device_type) {
    AutocastState state;
    state.device_type = device_type;
    state.enabled = at::autocast::is_autocast_enabled(device_type);
    state.dtype = at::autocast::get_autocast_dtype(device_type);
    state.cache_enabled = at::autocast::is_autocast_cache_enabled();
    // The count can only be stepped: one step up tells it.
    state.nesting = at::autocast::increment_nesting() - 1;
    at::autocast::decrement_nesting();
    return state;
  }

  // Makes this the thread's state, replacing ``now``.
  void install(const AutocastState& now) const {
    at::autocast::set_autocast_enabled(device_type, enabled);
    at::autocast::set_autocast_dtype(device_type, dtype);
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

  bool operator==(const AutocastState&) const = default;
};

// NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
struct THPAutocastState {
  PyObject_HEAD
  AutocastState state;
};

// Equal states: so that a traced body's step can be checked to leave its
// decorator's state as it found it (torch.utils._contextlib._driver).
PyObject* richcompare(PyObject* self, PyObject* other, int op) {
  if (Py_TYPE(other) != Py_TYPE(self) || (op != Py_EQ && op != Py_NE)) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  const bool equal = reinterpret_cast<THPAutocastState*>(self)->state ==
      reinterpret_cast<THPAutocastState*>(other)->state;
  return PyBool_FromLong(equal == (op == Py_EQ));
}

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
    "A thread's autocast state for one device type.", /* tp_doc */
    nullptr, /* tp_traverse */
    nullptr, /* tp_clear */
    richcompare, /* tp_richcompare */
};

// Returns a new reference to the calling thread's state for ``device_type``.
PyObject* capture(at::DeviceType device_type, const AutocastState** out) {
  auto self = PyObject_New(THPAutocastState, &THPAutocastStateType);
  if (!self) {
    return nullptr;
  }
  *out = new (&self->state) AutocastState(AutocastState::current(device_type));
  return reinterpret_cast<PyObject*>(self);
}

// Takes a device type as torch.get_autocast_dtype does: a str such as "cuda".
PyObject* get_autocast_state(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      PyUnicode_Check(arg),
      "_get_autocast_state(): device_type must be a str, not ",
      Py_TYPE(arg)->tp_name);
  const auto name = THPUtils_unpackString(arg);
  const auto device_type = at::Device(name).type();
  const auto& supported = at::autocast::_AUTOCAST_SUPPORTED_DEVICES;
  TORCH_CHECK_VALUE(
      std::ranges::find(supported, device_type) != supported.end(),
      "_get_autocast_state(): autocast does not support device type '",
      name,
      "'");
  const AutocastState* state = nullptr;
  return capture(device_type, &state);
  END_HANDLE_TH_ERRORS
}

// Installs ``state`` and returns the state it replaced, of its device type.
PyObject* swap_autocast_state(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      Py_TYPE(arg) == &THPAutocastStateType,
      "_swap_autocast_state(): expected a state from _get_autocast_state(), "
      "got ",
      Py_TYPE(arg)->tp_name);
  const auto& state = reinterpret_cast<THPAutocastState*>(arg)->state;
  const AutocastState* now = nullptr;
  PyObject* previous = capture(state.device_type, &now);
  if (previous) {
    state.install(*now);
  }
  return previous;
  END_HANDLE_TH_ERRORS
}

// NOLINTNEXTLINE(*-avoid-c-arrays)
PyMethodDef methods[] = {
    {"_get_autocast_state",
     get_autocast_state,
     METH_O,
     "Return the calling thread's autocast state for a device type."},
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
