"""pi2.reference — the numpy specification every fast path is tested against: the forward pass, the quant types,
llama.cpp's float orders, the int8 down rows and the sparse FFN's semantics."""
