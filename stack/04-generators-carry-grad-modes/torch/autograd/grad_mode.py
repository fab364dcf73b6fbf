# Step 04's versions of definitions later steps change (see stack/README.md).


_GRAD_MODE_STATE = _flag_state(torch._C.is_grad_enabled, torch._C._set_grad_enabled)
