"""Streaming a published copy through the grain pipeline's source: rows/s and peak RSS at 10k and 200k rows.

Two layouts, each written once per size: STVQA-7K's parquet (every row embedding a small PNG, row groups of
1,000 rows) and SPAR-7M's LLaVA JSON lines (an image path per row). Each arm runs in its own process (peak RSS is a
process's high-water mark), the arms of a size side by side from this script:
  stream   data/sources: the row index only; each row read and converted when grain asks for it
  eager    the whole table read into memory first (as the benchmark loaders read theirs), then converted
Read in file order through grain.MapDataset.source(...).to_iter_dataset() with the pipeline's read options
(data.read_threads, default 0: read in the consuming thread, as DataIterator does; --threads 16 is grain's own
default); `shuffled` reads the first 2,000 rows of grain's index shuffle (parquet: each row reads its row group).
The conversion decodes each embedded image.

    python benchmarks/training/data_streaming.py [--sizes 10000 200000] [--threads N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spatial_jax.cli.outputs import check_room
from spatial_jax.cli.script_guard import check_counts, claim_folder
from spatial_jax.config import ConfigError

OWNER = Path(__file__).name
ROW_BYTES = 2048  # a row of both layouts together, with room: the parquet row's PNG and the JSON line


def write_copies(root: Path, n: int) -> dict[str, str]:
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), np.uint8)).save(buf, format="PNG")
    image = buf.getvalue()
    specs = {"stvqa7k": f"stvqa7k:{root / f'stvqa7k_{n}'}:train",
             "spar7m": f"spar7m:{root / f'spar7m_{n}' / 'train.jsonl'}"}
    if (root / f"spar7m_{n}" / "train.jsonl").is_file():  # written by an earlier run (--out)
        return specs
    st = root / f"stvqa7k_{n}" / "data"
    st.mkdir(parents=True)
    writer = None
    for start in range(0, n, 10_000):
        rows = [{"image_id": f"i{k}", "images": {"bytes": image, "path": None},
                 "question_only": f"Where is object {k} relative to the table?",
                 "options": ["A. left", "B. right", "C. above", "D. below"],
                 "answer_option_text": "(B) right", "answer": "<answer>(B) right</answer>", "category": "relation"}
                for k in range(start, min(n, start + 10_000))]
        table = pa.Table.from_pylist(rows)
        writer = writer or pq.ParquetWriter(st / "train-00000-of-00001.parquet", table.schema)
        writer.write_table(table, row_group_size=1000)
    writer.close()
    spar = root / f"spar7m_{n}"
    (spar / "img").mkdir(parents=True)
    (spar / "img" / "0.png").write_bytes(image)
    with open(spar / "train.jsonl", "w") as f:
        for k in range(n):
            f.write(json.dumps({"id": f"s{k}", "image": "img/0.png", "type": "distance", "conversations": [
                {"from": "human", "value": f"<image>\nHow far is object {k} from the door? A. 1 m B. 2 m"},
                {"from": "gpt", "value": "B"}]}) + "\n")
    return specs


def arm(spec: str, mode: str, threads: int) -> dict:
    """One measurement, in this process: rows/s of a full pass in file order, of 2,000 shuffled reads, peak RSS."""
    import grain

    from spatial_jax.data.sources import open_spec
    from spatial_jax.data.sources.rows import ListRows, Source

    t0 = time.perf_counter()
    source = open_spec(spec)
    if mode == "eager":
        rows = [source.rows[i] for i in range(len(source))]  # every row parsed and held, then converted
        source = Source(ListRows([r.data for r in rows], Path("eager")), source.convert, source.name)
        source = [source[i] for i in range(len(source))]
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=max(1, 2 * threads))  # as DataIterator
    n = sum(1 for _ in grain.MapDataset.source(source).to_iter_dataset(options))
    ordered = time.perf_counter() - t0
    ds = grain.MapDataset.source(source).shuffle(seed=0)
    t0 = time.perf_counter()
    k = sum(1 for i in range(min(2000, n)) if ds[i] is not None)
    shuffled = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rows": n, "open_s": opened, "rows_per_s": n / ordered, "shuffled_rows_per_s": k / shuffled,
            "peak_rss_mb": peak_kb / 1024}


def table(results: list[dict]) -> None:
    """The markdown table; `open + pass` counts the eager arm's upfront read and conversion with its pass."""
    print("\n| layout | rows | arm | open s | rows/s (pass) | rows/s (open + pass) | rows/s (shuffled, 2k) | "
          "peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        total = r["rows"] / (r["open_s"] + r["rows"] / r["rows_per_s"])
        print(f"| {r['layout']} | {r['size']:,} | {r['mode']} | {r['open_s']:.2f} | {r['rows_per_s']:,.0f} | "
              f"{total:,.0f} | {r['shuffled_rows_per_s']:,.0f} | {r['peak_rss_mb']:.0f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 200_000])
    p.add_argument("--threads", type=int, default=0, help="grain reading threads (data.read_threads; default 0)")
    p.add_argument("--out", default=None, help="folder for the copies (default: a temporary one)")
    p.add_argument("--arm", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.arm:
        print(json.dumps(arm(args.arm[0], args.arm[1], int(args.arm[2]))))
        return
    try:
        check_counts({"--sizes": (args.sizes, 1, 10**7), "--threads": (args.threads, 0, 256)})
        check_room(args.out or tempfile.gettempdir(), ROW_BYTES * sum(args.sizes), "--sizes")
        root = claim_folder(args.out, "--out", OWNER) if args.out is not None else Path(tempfile.mkdtemp(
            prefix="streaming_"))
    except ConfigError as e:
        p.error(str(e))
    results = []
    for n in args.sizes:
        for layout, spec in write_copies(root, n).items():
            for mode in ("stream", "eager"):
                out = subprocess.run([sys.executable, __file__, "--arm", spec, mode, str(args.threads)], check=True,
                                     capture_output=True, text=True).stdout
                results.append({"layout": layout, "size": n, "mode": mode, "threads": args.threads,
                                **json.loads(out.splitlines()[-1])})
                print(json.dumps(results[-1]), flush=True)
    table(results)
    for layout in ("stvqa7k", "spar7m"):
        for mode in ("stream", "eager"):
            rss = [r["peak_rss_mb"] for r in results if r["layout"] == layout and r["mode"] == mode]
            if len(rss) >= 2:
                print(f"{layout} {mode}: peak RSS {args.sizes[-1]:,} / {args.sizes[0]:,} rows = {rss[-1] / rss[0]:.2f}")


if __name__ == "__main__":
    main()
