"""cubelm's data pipeline in Python for perf/torch_gpt2.py's agreement check
(--check-against): its random generator, synthetic corpus, token file readers
and samplers, exactly as docs/data.md describes them."""

MASK64 = (1 << 64) - 1


def splitmix64_mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Rng:
    """cubelm's io::Rng (docs/data.md): xoshiro256** seeded by splitmix64."""

    def __init__(self, seed, stream=0):
        x = (seed ^ splitmix64_mix(stream)) & MASK64
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & MASK64
            self.s.append(splitmix64_mix(x))

    def next(self):
        s0, s1, s2, s3 = self.s
        r = (((s1 * 5) & MASK64) << 7 | ((s1 * 5) & MASK64) >> 57) & MASK64
        r = (r * 9) & MASK64
        t = (s1 << 17) & MASK64
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= t
        s3 = ((s3 << 45) | (s3 >> 19)) & MASK64
        self.s = [s0, s1, s2, s3]
        return r

    def below(self, n):
        threshold = (1 << 64) % n
        while True:
            r = self.next()
            if r >= threshold:
                return r % n


def synthetic_corpus(vocab, count, branching, seed):
    """cubelm's io::make_synthetic_corpus (docs/data.md, Synthetic corpus)."""
    rng = Rng(seed, MASK64)
    p = list(range(vocab))
    succ = [0] * (vocab * branching)
    for a in range(vocab):
        for i in range(branching):
            j = i + rng.below(vocab - i)
            p[i], p[j] = p[j], p[i]
            succ[a * branching + i] = p[i]
    tokens = [0] * count
    if count:
        tokens[0] = rng.below(vocab)
        for i in range(1, count):
            tokens[i] = succ[tokens[i - 1] * branching + rng.below(branching)]
    return tokens


def read_tokens(fmt, path, vocab):
    import numpy as np
    if fmt == "llmc":
        header = np.fromfile(path, dtype="<i4", count=256)
        if len(header) < 256 or header[0] != 20240520 or header[1] != 1:
            raise SystemExit(f"torch_gpt2: {path}: not an llm.c version-1 token file")
        tokens = np.fromfile(path, dtype="<u2", offset=1024)
        if len(tokens) != header[2]:
            raise SystemExit(f"torch_gpt2: {path}: {len(tokens)} tokens, the header says "
                             f"{header[2]}")
    elif fmt == "text":
        tokens = np.fromfile(path, dtype=np.uint8)
    elif fmt == "megatron":
        prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
        idx = open(prefix + ".idx", "rb").read()
        if idx[:9] != b"MMIDIDX\x00\x00":
            raise SystemExit(f"torch_gpt2: {prefix}.idx: not a Megatron index")
        code = idx[17]
        dtype = {8: "<u2", 4: "<i4"}[code]
        size = np.dtype(dtype).itemsize
        n = int(np.frombuffer(idx, dtype="<u8", count=1, offset=18)[0])
        lengths = np.frombuffer(idx, dtype="<i4", count=n, offset=34)
        pointers = np.frombuffer(idx, dtype="<i8", count=n, offset=34 + 4 * n)
        data = np.fromfile(prefix + ".bin", dtype=np.uint8)
        tokens = np.concatenate([np.frombuffer(data[o:o + ln * size].tobytes(), dtype=dtype)
                                 for o, ln in zip(pointers, lengths)] or [np.zeros(0, dtype)])
    else:
        raise SystemExit(f"torch_gpt2: data.format {fmt!r} is not known")
    tokens = tokens.astype(np.int64)
    if len(tokens) and tokens.max() >= vocab:
        raise SystemExit(f"torch_gpt2: {path}: token {tokens.max()} is outside the "
                         f"vocabulary of {vocab}")
    return tokens


class Sampler:
    """cubelm's samplers (docs/data.md, Samplers): the first token of sequence k of step t."""

    def __init__(self, kind, n, batch, context, seed):
        if n < context + 2:
            raise SystemExit(f"torch_gpt2: {n} tokens are too few for context {context}")
        self.kind, self.n, self.B, self.T, self.seed = kind, n, batch, context, seed
        self.windows = (n - 1) // context
        self.epoch, self.perm = None, None

    def permutation(self, epoch):
        if epoch != self.epoch:
            perm = list(range(self.windows))
            rng = Rng(self.seed, epoch)
            for j in range(self.windows - 1, 0, -1):
                r = rng.below(j + 1)
                perm[j], perm[r] = perm[r], perm[j]
            self.epoch, self.perm = epoch, perm
        return self.perm

    def start(self, step, k):
        i = step * self.B + k
        if self.kind == "sequential":
            m = self.n - self.T - 1
            return ((i % m) * self.T) % m
        return self.permutation(i // self.windows)[i % self.windows] * self.T
