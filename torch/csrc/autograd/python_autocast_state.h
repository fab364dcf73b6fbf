#pragma once

// torch._C._AutocastState and the two functions that capture and switch it;
// see python_autocast_state.cpp.

#include <torch/csrc/python_headers.h>

namespace torch::autograd {

void init_autocast_state(PyObject* module);

} // namespace torch::autograd
