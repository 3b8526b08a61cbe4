"""The tokenizer of a Llama GGUF file, as llama.cpp tokenizes it, from the file's metadata
(tokenizer.ggml.*). model "gpt2": a `tokenizers.Tokenizer`, GPT-2 byte-level BPE with the
pre-tokenizer llama.cpp uses for tokenizer.ggml.pre (Llama-3, SmolLM2, Qwen2). model "llama":
SentencePiece pieces merged greedily by score with <0xXX> byte fallback, llama.cpp's
llm_tokenizer_spm (Llama-1/2, Mistral 7B, TinyLlama); see SentencePieceMerges for why that one is not
a `tokenizers` BPE. data/gguf_llama.py (the loader) builds and caches it.
"""
import heapq



# GPT-2's pre-tokenizer regex, as tokenizers' ByteLevel(use_regex=True) applies it.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> (regexes applied in turn before byte-level mapping, ignore_merges), after
# llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp): SmolLM's "smollm" shares StarCoder's split,
# every digit on its own ("\p{N}") and then GPT-2's regex.
PRE_TOKENIZERS = {}
for _name in ("gpt2", "mpt", "olmo", "jais"):
    PRE_TOKENIZERS[_name] = ([_GPT2], False)
for _name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"):
    PRE_TOKENIZERS[_name] = ([r"\p{N}", _GPT2], False)
for _name in ("llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"):
    PRE_TOKENIZERS[_name] = ([_LLAMA3], True)
for _name in ("qwen2", "stablelm2"):
    PRE_TOKENIZERS[_name] = ([_QWEN2], False)
UNKNOWN, CONTROL, USER_DEFINED, BYTE = 2, 3, 4, 6  # llama.cpp's LLAMA_TOKEN_TYPE_*
TOKENIZER_MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece"}
SPACE = "\u2581"  # "▁": SentencePiece's visible space


def _unsupported_model(path, model):
    kinds = ", ".join(f"{m!r} ({k})" for m, k in TOKENIZER_MODELS.items())
    return ValueError(f"{path}: tokenizer.ggml.model is {model!r}; kvq reads the tokenizers {kinds}")


class SentencePieceMerges:
    """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm) for tokenizer.ggml.model "llama".

    encode(text) -> ids, without BOS. The text is cut at every user-defined token (type 4; control
    tokens, type 3, are plain text here, as llama.cpp reads them when not asked to parse specials);
    each other fragment gets a leading space when add_space_prefix, its spaces become "▁", and its
    characters are merged greedily: at each step the adjacent pair whose concatenation is a token
    with the highest score, the leftmost of equal scores. A piece left that is no token becomes the
    <0xXX> tokens of its UTF-8 bytes. decode reverses it.

    Not a `tokenizers` BPE (Hugging Face's SentencePiece converter, merges ranked by score): a BPE
    applies merges by a fixed rank, so it cannot take the leftmost of two merges of equal score. With
    the tokens a, b, ab, ba all of one score, llama.cpp gives "aba" -> ab a and "bab" -> ba b; a rank
    order puts ab or ba first and gets one of the two wrong. The rule is short, so it is written out."""

    def __init__(self, tokens, scores, types, add_space_prefix=True, path="<gguf>"):
        # llama.cpp names an empty token [EMPTY_<id>], and a text given twice is its last id
        self.tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.scores = [float(x) for x in scores] if scores else [0.0] * len(tokens)
        self.types = list(types) if types else [1] * len(tokens)
        if not len(self.scores) == len(self.types) == len(self.tokens):
            raise ValueError(f"{path}: tokenizer.ggml.scores and token_type must have one entry per token "
                             f"({len(self.tokens)})")
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.add_space_prefix = bool(add_space_prefix)
        self.path = path
        # matched in the text first, the longest first (llama.cpp's special-token cache order)
        self.user = sorted((i for i, k in enumerate(self.types) if k == USER_DEFINED),
                           key=lambda i: -len(self.tokens[i].encode("utf-8")))

    def encode(self, text):
        fragments = [text] if text else []
        for uid in self.user:
            piece, cut = self.tokens[uid], []
            for f in fragments:
                if isinstance(f, int):
                    cut.append(f)
                    continue
                for k, part in enumerate(f.split(piece)):
                    if k:
                        cut.append(uid)
                    if part:
                        cut.append(part)
            fragments = cut
        ids, after_token = [], True  # a fragment at the start or after a token gets the prefix space
        for f in fragments:
            if isinstance(f, int):
                ids.append(f)
                after_token = True
                continue
            if self.add_space_prefix and after_token:
                f = " " + f
            self._merge(f.replace(" ", SPACE), ids)
            after_token = False
        return ids

    def _merge(self, text, out):
        sym = list(text)  # one symbol per character; "" once merged into its left neighbour
        n = len(sym)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        queue = []  # (-score, left, right, length of the pair's text): best score, then leftmost

        def push(left, right):
            if left >= 0 and right >= 0:
                tid = self.ids.get(sym[left] + sym[right])
                if tid is not None:
                    heapq.heappush(queue, (-self.scores[tid], left, right, len(sym[left]) + len(sym[right])))

        for i in range(1, n):
            push(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue  # one of the two has changed since the pair was queued
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        i = 0 if n else -1
        while i >= 0:
            tid = self.ids.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte(b) for b in sym[i].encode("utf-8"))
            i = nxt[i]

    def _byte(self, b):
        tid = self.ids.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.ids.get(chr(b))
        if tid is None:
            raise ValueError(f"{self.path}: the text needs the byte token <0x{b:02X}>, which the vocabulary lacks")
        return tid

    def decode(self, ids):
        """Byte tokens as their bytes, "▁" as a space, the prefix space of each fragment dropped; control
        and unknown tokens as nothing (llama.cpp's rendering without specials), user-defined as written."""
        out, start = bytearray(), True
        for i in ids:
            kind, piece = self.types[i], self.tokens[i]
            if kind in (CONTROL, UNKNOWN):
                start = start or kind == CONTROL
                continue
            if kind == USER_DEFINED:
                out += piece.encode("utf-8")
                start = True
                continue
            if kind == BYTE and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(int(piece[3:5], 16))
            else:
                b = piece.replace(SPACE, " ").encode("utf-8")
                out += b[1:] if start and self.add_space_prefix and b.startswith(b" ") else b
            start = False
        return out.decode("utf-8", errors="replace")


class GgufTokenizer:
    """The GGUF file's tokenizer: "gpt2" (byte-level BPE) as a tokenizers.Tokenizer (no hand-written
    BPE), "llama" (SentencePiece) as SentencePieceMerges.

    meta: the tokenizer.ggml.* values (see from_reader). encode(text) -> ids (BOS first when the file
    says tokenizer.ggml.add_bos_token); decode(ids) -> text."""

    def __init__(self, meta, path="<gguf>"):
        self.spm = None
        if meta.get("model") == "llama":
            self.meta = meta
            self.spm = SentencePieceMerges(meta["tokens"], meta.get("scores"), meta.get("token_type"),
                                           meta.get("add_space_prefix", True), path)
            self.tokenizer = None
            self.bos_id, self.eos_id = meta.get("bos_id"), meta.get("eos_id")
            self.add_bos = bool(meta.get("add_bos", True))
            self.vocab_size = len(meta["tokens"])
            return
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
        if meta.get("model") != "gpt2":
            raise _unsupported_model(path, meta.get("model"))
        pre = meta.get("pre") or "default"
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"{path}: tokenizer.ggml.pre is {pre!r}, expected one of {sorted(PRE_TOKENIZERS)}")
        self.meta = meta
        regexes, ignore_merges = PRE_TOKENIZERS[pre]
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        spell = _bytes_to_unicode()
        tokens = meta["tokens"]
        # llama.cpp stores tokens in GPT-2's byte-level spelling, except a few whose bytes it wrote raw:
        # spell those as the merges do.
        vocab = {}
        for i, tok in enumerate(tokens):
            key = tok if set(tok) <= alphabet else "".join(spell[b] for b in tok.encode("utf-8"))
            vocab.setdefault(key, i)
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        tk = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges))
        # The last regex GPT-2's: ByteLevel applies it; any other: a Split, then the byte mapping alone.
        gpt2_last = regexes[-1] == _GPT2
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in (regexes[:-1] if gpt2_last else regexes)]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_last)
        tk.pre_tokenizer = pre_tokenizers.Sequence(splits + [byte_level])
        tk.decoder = decoders.ByteLevel()
        types = meta.get("token_type") or []
        special = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
                   if k == CONTROL and set(t) <= alphabet]
        user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
                if k == USER_DEFINED and set(t) <= alphabet]
        if special:
            tk.add_special_tokens(special)
        if user:
            tk.add_tokens(user)
        self.tokenizer = tk
        self.bos_id, self.eos_id = meta.get("bos_id"), meta.get("eos_id")
        self.add_bos = bool(meta.get("add_bos", False))
        self.vocab_size = len(tokens)

    @classmethod
    def from_reader(cls, reader, path="<gguf>"):
        def get(key, default=None):
            f = reader.fields.get("tokenizer.ggml." + key)
            return default if f is None else f.contents()
        model = get("model")
        if model is not None and model not in TOKENIZER_MODELS:
            raise _unsupported_model(path, model)
        if model == "llama":
            if get("tokens") is None:
                raise ValueError(f"{path}: missing metadata key 'tokenizer.ggml.tokens'")
            # llama.cpp's defaults for a SentencePiece vocabulary where the file names none
            meta = {"model": model, "tokens": list(get("tokens")),
                    "scores": [float(x) for x in get("scores", [])],
                    "token_type": [int(t) for t in get("token_type", [])],
                    "bos_id": int(get("bos_token_id", 1)), "eos_id": int(get("eos_token_id", 2)),
                    "add_bos": bool(get("add_bos_token", True)),
                    "add_space_prefix": bool(get("add_space_prefix", True))}
            return cls(meta, path)
        for key in ("model", "tokens", "merges"):
            if get(key) is None:
                raise ValueError(f"{path}: missing metadata key 'tokenizer.ggml.{key}'")
        meta = {"model": get("model"), "pre": get("pre", "default"), "tokens": list(get("tokens")),
                "merges": list(get("merges")), "token_type": [int(t) for t in get("token_type", [])],
                "bos_id": get("bos_token_id"), "eos_id": get("eos_token_id"),
                "add_bos": bool(get("add_bos_token", False))}
        return cls(meta, path)

    @classmethod
    def from_gguf(cls, path):
        from gguf_llama import _open_reader  # the loader opens GGUF files (it imports this module)
        return cls.from_reader(_open_reader(path), path)

    def encode(self, text):
        ids = self.spm.encode(text) if self.spm else self.tokenizer.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if self.add_bos and self.bos_id is not None else []) + ids

    def decode(self, ids, skip_special_tokens=False):
        """skip_special_tokens: "gpt2" only; "llama" renders control tokens (BOS, EOS) as nothing always."""
        if self.spm:
            return self.spm.decode(ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
