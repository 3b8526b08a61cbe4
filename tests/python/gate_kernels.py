"""The deliberately wrong decode kernels of tests/python/test_gate.py: kvq.gate_mutants' catalogue (each
makes one mistake real kernels make), with the families each must fail in the tests here."""
from kvq.gate import Kernel
from kvq.gate_mutants import (bf16_pv, e2m1_not_doubled, fifth_bits_ignored, fixed_softmax_scale,  # noqa: F401
                              ggml_blocks_reversed, ignores_alibi, ignores_page_table, nibbles_swapped,
                              no_softmax_scale, noisy, off_by_one, reads_padding, scale_zero_swapped, wrong_gqa)

# Each wrong kernel with its declarations and the families that must catch it ([FAIL]).
WRONG = {
    "reads_padding": (Kernel(reads_padding, name="reads-padding"), {"varlen", "alibi", "odd_t", "no_keys"}),
    "wrong_gqa": (Kernel(wrong_gqa, name="wrong-gqa"), {"varlen", "alibi", "odd_t", "keys33"}),
    "off_by_one": (Kernel(off_by_one, name="off-by-one"), {"varlen", "one_key", "mha", "keys33"}),
    "no_softmax_scale": (Kernel(no_softmax_scale, name="no-softmax-scale"), {"varlen", "mha", "mqa"}),
    "fixed_softmax_scale": (Kernel(fixed_softmax_scale, name="fixed-softmax-scale"), {"mqa"}),
    "ignores_alibi": (Kernel(ignores_alibi, name="ignores-alibi", alibi=True), {"alibi"}),
    "noisy": (Kernel(noisy, name="noisy", deterministic=True), {"reruns"}),
}
