"""`gputrain prepare`: a corpus (text files, JSONL, Parquet, saved datasets) into token shards and a
manifest, the prepared folder `data.name=tokens` reads (issue 30's contract, §3).

One idea a module: sources.py (the files and their documents), tokenizer.py (the stand-in for
gputrain/text/tokenizer.py), encode.py (ids in a pool, in order; the val split's hash), shards.py
(the shard writer), manifest.py (the manifest and the resume state), progress.py (the bar),
work.py (the whole, resumable).
"""
