// Project-only: loads the upstream-bound binding
// (torch/csrc/autograd/python_autograd_mode_state.cpp) into a prebuilt torch
// wheel.  Upstream, torch._C calls init_autograd_mode_state from initModule
// (beside init_legacy_variable); here the start-up hook calls register_into
// with torch._C right after torch._C is loaded.

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_autocast_state.h>
#include <torch/csrc/autograd/python_autograd_mode_state.h>

namespace {

PyObject* register_into(PyObject* /*module*/, PyObject* target) {
  HANDLE_TH_ERRORS
  torch::autograd::init_autograd_mode_state(target);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* register_autocast_into(PyObject* /*module*/, PyObject* target) {
  HANDLE_TH_ERRORS
  torch::autograd::init_autocast_state(target);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"register_into",
     register_into,
     METH_O,
     "Add the autograd mode state binding to a module (torch._C)."},
    {"register_autocast_into",
     register_autocast_into,
     METH_O,
     "Add the autocast state binding to a module (torch._C)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_torch_gradmode_C",
    "The grad-mode patch's C++ half, built against the installed torch wheel.",
    -1,
    methods};

} // namespace

PyMODINIT_FUNC PyInit__torch_gradmode_C() {
  PyObject* module = PyModule_Create(&module_def);
  // The torch release the headers came from: the binding inlines the layout
  // of its thread-local state, so the start-up hook refuses any other.
  if (module &&
      PyModule_AddStringConstant(
          module, "built_for_torch", TORCH_GRADMODE_BUILT_FOR) < 0) {
    Py_CLEAR(module);
  }
  return module;
}
