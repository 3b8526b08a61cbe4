"""kvq eval's long texts, llama-perplexity style: the text cut into windows of --ctx tokens, each run
from position 0, and the next-token metrics of every position kept per window so that a pair's
numbers are given per window and over all of them. Both engines (the CPU path and the GPU engine)
produce PositionMetrics; everything here is numpy.
"""
from dataclasses import dataclass

import numpy as np


def cut_windows(tokens, ctx=None):
    """Consecutive windows of ctx tokens ([tokens] without ctx). A tail shorter than ctx is dropped,
    as llama-perplexity drops it; a text shorter than one window is an error."""
    tokens = list(tokens)
    if ctx is None:
        return [tokens]
    if ctx < 2:
        raise ValueError(f"--ctx {ctx}: a window needs at least 2 tokens (perplexity scores token t + 1 from t)")
    if len(tokens) < ctx:
        raise ValueError(f"--ctx {ctx}: the text has only {len(tokens)} tokens, fewer than one window "
                         "(give a longer --text or a smaller --ctx)")
    return [tokens[i:i + ctx] for i in range(0, len(tokens) - ctx + 1, ctx)]


@dataclass
class PositionMetrics:
    """One window of one pair: KL(P_ref || P_pair) per position [T] (nats), whether the top-1 tokens
    agree [T], and the negative log-likelihood of each next token [T - 1] under both runs."""
    kl: np.ndarray
    agree: np.ndarray
    nll_ref: np.ndarray
    nll: np.ndarray


def log_softmax(logits):
    """In float64: float32 logits would put rounding noise of ~1e-7 nats into the KL of fp16 caches."""
    z = np.array(logits, dtype=np.float64)  # a copy, then in place: fresh [T, vocab] arrays cost page faults
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


class Reference:
    """The reference run's log-probabilities, probabilities and top-1 over one window, computed once."""

    def __init__(self, logits, tokens):
        self.lp = log_softmax(logits)
        self.p = np.exp(self.lp)
        self.neg_entropy = np.einsum("ij,ij->i", self.p, self.lp)  # sum p log p per position
        self.top1 = self.lp.argmax(axis=-1)
        self.nll = next_token_nll(self.lp, tokens)


def next_token_nll(lp, tokens):
    """-log P(tokens[t + 1]) under log-probabilities lp [T, vocab], t < T - 1."""
    if len(tokens) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(tokens)}")
    return -lp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]


def position_metrics(ref, logits, tokens):
    """A pair's logits [T, vocab] against the window's Reference."""
    lp = log_softmax(logits)
    return PositionMetrics(kl=ref.neg_entropy - np.einsum("ij,ij->i", ref.p, lp), agree=ref.top1 == lp.argmax(axis=-1),
                           nll_ref=ref.nll, nll=next_token_nll(lp, tokens))


def summarize(windows):
    """A pair's numbers over a list of PositionMetrics (one per window): the mean and max KL over
    every position, top-1 agreement, and the perplexities exp(mean NLL) of every scored token."""
    kl = np.concatenate([w.kl for w in windows])
    nll_ref, nll = np.concatenate([w.nll_ref for w in windows]), np.concatenate([w.nll for w in windows])
    ppl_ref, ppl = float(np.exp(nll_ref.mean())), float(np.exp(nll.mean()))
    return {"kld_mean": float(kl.mean()), "kld_max": float(kl.max()),
            "top1_agreement": float(np.concatenate([w.agree for w in windows]).mean()),
            "ppl_ref": ppl_ref, "ppl": ppl, "ppl_delta": ppl - ppl_ref}
