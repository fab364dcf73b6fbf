# A fragment of torch/cuda/amp/autocast_mode.py: the definitions the patch adds
# or replaces there (see overlay/_torch_gradmode_splice.py).


class autocast(torch.amp.autocast_mode.autocast):
    # Its __enter__ and __exit__ only defer to torch.amp's.
    _carried_state = torch.amp.autocast_mode._AUTOCAST_STATE
