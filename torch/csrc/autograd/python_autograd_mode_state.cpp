// A thread's autograd mode state as a Python value, so that
// torch.utils._contextlib can swap a suspended body's state in around each of
// its steps and its caller's back after each.  A guard cannot do this:
// c10::InferenceMode restores the whole dispatch key set it found, dropping
// whatever else the body or its caller changed meanwhile.
//
// The state is the thread's c10::AutogradState and the dispatch key bits
// inference mode toggles.  A state from _get_autograd_mode_state() is
// restored whole, key set and all: the guard's exit at a body's end restores
// the key set of the body's first step.  The caller's state that a swap
// returns gives back only the bits inference mode toggles: the body's step
// may change the others, as the undecorated body would.  A body's state holds
// the bits the body changed itself
// (all of them once its inference mode differs from its caller's), set over
// the thread's: a body first stepped below autograd (in __torch_dispatch__,
// say) does not carry that exclusion out of there.

#include <torch/csrc/autograd/python_autograd_mode_state.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/object_ptr.h>

#include <new>
#include <tuple>

namespace torch::autograd {

namespace {

// Dispatch key bits: some of the thread-local included and excluded sets.
struct KeyBits {
  c10::DispatchKeySet included;
  c10::DispatchKeySet excluded;
};

// The bits inference mode toggles: see Note [Expected TLS state in
// InferenceMode].  Functionality bits only: backend bits are shared with
// other keys (see overlay).
constexpr KeyBits kInferenceBits{
    .included = c10::DispatchKeySet(c10::DispatchKey::ADInplaceOrView),
    .excluded = c10::autograd_dispatch_keyset};

// ``to`` with the functionality bits of ``from`` where ``mask`` is set.  The
// backend bits are shared by every per-backend key of a set: they are
// ``from``'s where ``to``'s other functionality bits are ``from``'s too (so a
// captured state comes back exactly), else those both need.
c10::DispatchKeySet overlay(
    c10::DispatchKeySet to,
    c10::DispatchKeySet from,
    c10::DispatchKeySet mask) {
  const uint64_t backends = c10::backend_bitset_mask.raw_repr();
  const uint64_t others = ~mask.raw_repr() & ~backends;
  const uint64_t kept = to.raw_repr() & others;
  const uint64_t backend_bits = kept == (from.raw_repr() & others)
      ? from.raw_repr() & backends
      : (to.raw_repr() | from.raw_repr()) & backends;
  return c10::DispatchKeySet(
      c10::DispatchKeySet::RAW,
      kept | (from.raw_repr() & mask.raw_repr() & ~backends) | backend_bits);
}

struct AutogradModeState {
  c10::AutogradState autograd = c10::AutogradState::get_tls_state();
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  // For a body's state, the bits it sets; for a captured one, those of the
  // body it replaced, handed back to that body when it is swapped out.
  KeyBits owned;
  bool is_body = false;
  bool whole = false; // from _get_autograd_mode_state(): restored whole
};

// NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
struct THPAutogradModeState {
  PyObject_HEAD
  AutogradModeState state;
};

AutogradModeState& unpack(PyObject* self) {
  return reinterpret_cast<THPAutogradModeState*>(self)->state;
}

// The graph execution group in AutogradState is a Python object that may
// refer back to the suspended body holding this state.
int traverse(PyObject* self, visitproc visit, void* arg) {
  if (const auto& group = unpack(self).autograd.get_graph_exec_group()) {
    Py_VISIT(group->ptr(&group->pyinterpreter()));
  }
  return 0;
}

int clear(PyObject* self) {
  unpack(self).autograd.set_graph_exec_group(std::nullopt);
  return 0;
}

void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  unpack(self).~AutogradModeState();
  Py_TYPE(self)->tp_free(self);
}

// Equal states are installed alike: the same c10::AutogradState and the
// same inference-mode key bits.  So that a traced body's step can be checked
// to leave its decorator's state as it found it (torch.utils._contextlib).
PyObject* richcompare(PyObject* self, PyObject* other, int op) {
  if (Py_TYPE(other) != Py_TYPE(self) || (op != Py_EQ && op != Py_NE)) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  const auto fields = [](const AutogradModeState& s) {
    const auto& group = s.autograd.get_graph_exec_group();
    return std::tuple{
        s.autograd.get_grad_mode(),
        s.autograd.get_inference_mode(),
        s.autograd.get_fw_grad_mode(),
        s.autograd.get_multithreading_enabled(),
        s.autograd.get_view_replay_enabled(),
        s.autograd.get_grad_layout_enforcement_enabled(),
        group ? group->ptr(&group->pyinterpreter()) : nullptr,
        s.keys.included_ & kInferenceBits.included,
        s.keys.excluded_ & kInferenceBits.excluded};
  };
  const bool equal = fields(unpack(self)) == fields(unpack(other));
  return PyBool_FromLong(equal == (op == Py_EQ));
}

PyTypeObject THPAutogradModeStateType = {
    PyVarObject_HEAD_INIT(nullptr, 0)
    "torch._C._AutogradModeState", /* tp_name */
    sizeof(THPAutogradModeState), /* tp_basicsize */
    0, /* tp_itemsize */
    dealloc, /* tp_dealloc */
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
    "A thread's autograd mode state.", /* tp_doc */
    traverse, /* tp_traverse */
    clear, /* tp_clear */
    richcompare, /* tp_richcompare */
};

// Returns a new reference to the calling thread's state, captured.
PyObject* capture(AutogradModeState** out) {
  auto self = PyObject_GC_New(THPAutogradModeState, &THPAutogradModeStateType);
  if (!self) {
    return nullptr;
  }
  *out = new (&self->state) AutogradModeState();
  if ((*out)->autograd.get_graph_exec_group()) {
    PyObject_GC_Track(self);
  }
  return reinterpret_cast<PyObject*>(self);
}

PyObject* get_autograd_mode_state(PyObject* /*module*/, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  AutogradModeState* state = nullptr;
  PyObject* captured = capture(&state);
  if (captured) {
    state->whole = true;
  }
  return captured;
  END_HANDLE_TH_ERRORS
}

// Installs ``state`` and returns the state it replaced: installing a body's
// state captures the caller's; installing the captured state back returns
// the body's.
PyObject* swap_autograd_mode_state(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      Py_TYPE(arg) == &THPAutogradModeStateType,
      "_swap_autograd_mode_state(): expected a state from "
      "_get_autograd_mode_state(), got ",
      Py_TYPE(arg)->tp_name);
  const AutogradModeState& state = unpack(arg);
  AutogradModeState* now = nullptr;
  PyObject* previous = capture(&now);
  if (!previous) {
    return nullptr;
  }
  // A body whose inference mode is not the thread's takes all the bits:
  // inference mode sets them all, even to what they were.
  bool toggles =
      now->autograd.get_inference_mode() != state.autograd.get_inference_mode();
  const KeyBits& owned =
      state.is_body && !toggles ? state.owned : kInferenceBits;
  auto keys = state.whole ? state.keys : now->keys;
  if (!state.whole) {
    keys.included_ =
        overlay(keys.included_, state.keys.included_, owned.included);
    keys.excluded_ =
        overlay(keys.excluded_, state.keys.excluded_, owned.excluded);
  }
  if (state.is_body) {
    now->owned = state.owned;
  } else {
    // The body's bits: those it set before, and those it changed since.
    now->owned = toggles
        ? kInferenceBits
        : KeyBits{
              .included = state.owned.included |
                  ((now->keys.included_ ^ state.keys.included_) &
                   kInferenceBits.included),
              .excluded = state.owned.excluded |
                  ((now->keys.excluded_ ^ state.keys.excluded_) &
                   kInferenceBits.excluded)};
    now->is_body = true;
  }
  c10::AutogradState::set_tls_state(state.autograd);
  c10::impl::_force_tls_local_dispatch_key_set(keys);
  return previous;
  END_HANDLE_TH_ERRORS
}

// Sets grad mode and returns the mode it replaced: the grad-mode decorators
// swap it around each step of a suspended body, in one call instead of two.
// Under a __torch_function__ mode it sets it through _set_grad_enabled, as
// the decorators' Python did, so that the mode sees it: torch.export's
// pre-dispatch tracer records grad mode from there.
PyObject* swap_grad_enabled(PyObject* module, PyObject* arg) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      PyBool_Check(arg),
      "_swap_grad_enabled(): expected a bool, got ",
      Py_TYPE(arg)->tp_name);
  const bool previous = c10::GradMode::is_enabled();
  if (at::impl::torch_function_mode_enabled()) {
    THPObjectPtr result(
        PyObject_CallMethod(module, "_set_grad_enabled", "O", arg));
    if (!result) {
      return nullptr;
    }
  } else {
    c10::GradMode::set_enabled(arg == Py_True);
  }
  return PyBool_FromLong(previous);
  END_HANDLE_TH_ERRORS
}

// NOLINTNEXTLINE(*-avoid-c-arrays)
PyMethodDef methods[] = {
    {"_get_autograd_mode_state",
     get_autograd_mode_state,
     METH_NOARGS,
     "Return the calling thread's autograd mode state."},
    {"_swap_autograd_mode_state",
     swap_autograd_mode_state,
     METH_O,
     "Install an autograd mode state; return the one it replaced."},
    {"_swap_grad_enabled",
     swap_grad_enabled,
     METH_O,
     "Set grad mode; return the mode it replaced."},
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
