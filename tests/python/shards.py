"""Helpers shared by the script tests: reassembling parameters from the shards that
`pentad train --dump-weights DIR` writes (one .npy per shard plus shards.pp<s>.tp<r>.r<rank>.json
with each shard's global identity, from the ranks that would save it to a checkpoint)."""
import json
from pathlib import Path

import numpy as np


def load_weights(folder):
    """Every parameter as one whole array, put together from its tp shards."""
    folder = Path(folder)
    whole = {}
    for manifest in sorted(folder.glob("shards.*.json")):
        for s in json.loads(manifest.read_text()):
            w = whole.setdefault(s["name"], np.full(s["global_shape"], np.nan, dtype=np.float32))
            part = np.load(folder / s["file"])
            if s["shard_dim"] < 0:
                w[...] = part
            else:
                index = [slice(None)] * w.ndim
                # a 2D tensor-parallel block is cut along a second dim too
                for d, start in ((s["shard_dim"], s["shard_start"]),
                                 (s.get("shard_dim2", -1), s.get("shard_start2", 0))):
                    if d >= 0:
                        index[d] = slice(start, start + part.shape[d])
                w[tuple(index)] = part
    for name, w in whole.items():
        assert not np.isnan(w).any(), f"{folder}: {name} is not fully covered by its shards"
    return whole
