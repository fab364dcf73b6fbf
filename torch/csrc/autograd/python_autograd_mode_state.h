#pragma once

// torch._C._AutogradModeState, the two functions that capture and switch
// it, and _swap_grad_enabled; see python_autograd_mode_state.cpp.

#include <torch/csrc/python_headers.h>

namespace torch::autograd {

void init_autograd_mode_state(PyObject* module);

} // namespace torch::autograd
