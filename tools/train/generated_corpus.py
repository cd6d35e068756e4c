#!/usr/bin/env python3
"""The model's own text, as training data for an EAGLE head (train_eagle.py):
a head learns to draft what the model writes, and the model's own sampled
continuations are that, where a fixed corpus is someone else's text.

  # 1. prompts: the first --chars characters of paragraphs of a corpus
  python3 tools/train/generated_corpus.py prompts --corpus train.txt --count 3200 > prompts.jsonl
  # 2. the model continues each (any device; sampling as users run it)
  build/bin/basalt generate --model MODEL --device cuda --batch prompts.jsonl --max-tokens 480 \\
      --temperature 0.8 --top-p 0.95 --max-running 512 > generated.jsonl
  # 3. prompt + continuation as documents, in the corpus format basalt_dump_hidden reads
  python3 tools/train/generated_corpus.py text --prompts prompts.jsonl --generated generated.jsonl > generated.txt

Standard library only. Corpus format: documents separated by lines holding
only the record separator 0x1E (tools/corpus).
"""
import argparse
import json
import random
import sys

SEPARATOR = "\n\x1e\n"


def prompts(args):
    with open(args.corpus, encoding="utf-8") as f:
        docs = f.read().split(SEPARATOR)
    if args.shuffle_seed is not None:
        random.seed(args.shuffle_seed)
        random.shuffle(docs)
    n = 0
    for doc in docs:
        for para in doc.split("\n\n"):
            para = para.strip()
            if len(para) < args.min_chars:
                continue
            sys.stdout.write(json.dumps({"prompt": para[:args.chars], "seed": n}) + "\n")
            n += 1
            if n >= args.count:
                return


def text(args):
    with open(args.prompts, encoding="utf-8") as f:
        given = [json.loads(line)["prompt"] for line in f if line.strip()]
    docs = []
    with open(args.generated, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            out = json.loads(line)
            if "text" not in out:  # a request that failed: its error is in the line
                continue
            docs.append(given[out["index"]] + out["text"])
    sys.stdout.write(SEPARATOR.join(docs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts", help="prompts JSONL for basalt generate --batch")
    p.add_argument("--corpus", required=True)
    p.add_argument("--count", type=int, default=3200)
    p.add_argument("--chars", type=int, default=160)
    p.add_argument("--min-chars", type=int, default=80)
    p.add_argument("--shuffle-seed", type=int, help="take the documents in an order shuffled with this seed")
    t = sub.add_parser("text", help="prompts and their continuations as a corpus")
    t.add_argument("--prompts", required=True)
    t.add_argument("--generated", required=True)
    args = ap.parse_args()
    prompts(args) if args.command == "prompts" else text(args)


if __name__ == "__main__":
    main()
