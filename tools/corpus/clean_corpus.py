#!/usr/bin/env python3
"""Turns the prose shipped by a fixed set of Debian packages into a plain-text
corpus with a held-out validation split.

  clean_corpus.py OUT_DIR

Reads the installed files of the packages listed in SOURCES below (the
build_corpus.sh next to this file installs them), extracts plain text from
HTML, POD, AsciiDoc/reST-like text, Info text and fortune files, normalizes
whitespace, drops paragraphs that are mostly symbols and paragraphs already
seen (navigation bars, repeated license headers), and writes:

  OUT_DIR/train.txt   training documents
  OUT_DIR/valid.txt   validation documents (about 1.5% of them)
  OUT_DIR/stats.json  counts per source

Texts longer than CHUNK characters are cut at paragraph boundaries into
several documents. Documents are separated by a line holding only the ASCII record separator
(0x1E); paragraphs inside a document by one blank line. A document goes to
the validation split when the SHA-256 of its text falls in the lowest 1.5%,
so the split does not depend on the order in which files are read; the
documents of each split are then shuffled with a fixed seed. Only the
standard library is used, so the same packages give the same bytes.
"""
import gzip
import hashlib
import html
import html.parser
import json
import os
import random
import re
import subprocess
import sys
import unicodedata

SEED = 20261129
VALID_PER_MILLE = 15
RS = "\x1e"
CHUNK = 16000

# package -> list of (path regex, kind). Paths come from `dpkg -L package`.
SOURCES = {
    "debian-handbook": [(r"/html/en-US/.*\.html$", "html")],
    "debian-reference-en": [(r"\.en\.html$|/debian-reference/.*\.html$", "html")],
    "debian-policy": [(r"/policy\.html/(?!_sources|genindex|search).*\.html$", "html")],
    "developers-reference": [(r"/developers-reference/(?!genindex|search).*\.html$", "html")],
    "maint-guide": [(r"\.en\.html$", "html")],
    "python3.11-doc": [(r"/html/(?!_sources|genindex|search|py-modindex|_static|whatsnew/changelog).*\.html$", "html")],
    "postgresql-doc-15": [(r"/html/(?!bookindex|release-).*\.html$", "html")],
    "bash-doc": [(r"/bashref\.html$", "html")],
    "git-doc": [(r"/git-doc/[^/]*\.txt$|/git-doc/howto/.*\.txt$|/git-doc/technical/.*\.txt$", "asciidoc")],
    "perl-doc": [(r"/pod/perl(?!\d+delta|delta|[a-z]*diag|toc|api|intern|uniprops).*\.pod$", "pod")],
    "gnu-standards": [(r"\.text\.gz$", "text")],
    "jargon-text": [(r"/jargon\.txt\.gz$", "text")],
    "fortunes": [(r"/games/fortunes/(?!ascii-art|art$|.*\.dat$|.*\.u8$|off/)[a-z-]+$", "fortune")],
    "fortunes-min": [(r"/games/fortunes/(fortunes|literature|riddles)$", "fortune")],
    "sqlite3-doc": [(r"/doc/sqlite3/(?!releaselog|changes|c3ref/(?!intro)|syntax/|sitemap|keyword_index|toc).*\.html$", "html")],
    "debian-faq": [(r"/FAQ/.*\.en\.html$", "html")],
    "installation-guide-amd64": [(r"/installation-guide-amd64/en/.*\.html$", "html")],
    "python-django-doc": [(r"/html/(?!_sources|genindex|search|py-modindex|_static|releases/).*\.html$", "html")],
    "apache2-doc": [(r"/manual/en/.*\.html$", "html")],
    "vim-runtime": [(r"/vim90/doc/[a-z0-9_]+\.txt$", "text")],
    "base-files": [(r"/common-licenses/[A-Za-z0-9.-]+$", "text")],
}

BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "h1", "h2", "h3",
              "h4", "h5", "h6", "pre", "blockquote", "section", "article", "header", "footer",
              "title", "hr", "td", "th", "figure", "caption", "body"}
SKIP_TAGS = {"script", "style", "head", "nav", "noscript", "svg", "math"}
SKIP_CLASSES = ("navheader", "navfooter", "navigation", "sphinxsidebar", "related", "footer",
                "toc", "breadcrumb", "headerlink", "highlight-none", "viewcode")


class HtmlText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip = 0          # depth inside skipped elements
        self.stack = []        # (tag, skipping) for elements that may be skipped
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr"):
            if tag in ("br", "hr") and not self.skip:
                self.out.append("\n")
            return
        a = dict(attrs)
        cls = (a.get("class") or "") + " " + (a.get("id") or "")
        skipping = tag in SKIP_TAGS or any(c in cls for c in SKIP_CLASSES) or a.get("role") == "navigation"
        self.stack.append((tag, skipping))
        if skipping:
            self.skip += 1
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK_TAGS and not self.skip:
            self.out.append("\n\n" if tag in ("p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "div",
                                              "section", "blockquote", "dt", "title") else "\n")

    def handle_endtag(self, tag):
        # Pop to the matching start tag (HTML in the wild is not always balanced).
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for t, s in self.stack[i:]:
                    if s:
                        self.skip -= 1
                    if t == "pre":
                        self.pre -= 1
                del self.stack[i:]
                break
        if tag in BLOCK_TAGS and not self.skip:
            self.out.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "title") else "\n")

    def handle_data(self, data):
        if self.skip:
            return
        if self.pre:
            self.out.append(data)
        else:
            self.out.append(re.sub(r"\s+", " ", data))


def html_text(raw):
    p = HtmlText()
    p.feed(raw)
    p.close()
    return "".join(p.out)


POD_CODE = re.compile(r"[BCFIILSXZE]<<+\s(.*?)\s>>+|[BCFILSXZ]<([^<>]*)>", re.S)


def pod_text(raw):
    out, in_pod = [], True
    for line in raw.splitlines():
        if line.startswith("=cut"):
            in_pod = False
            continue
        if line.startswith("="):
            in_pod = True
            m = re.match(r"=(head\d|item)\s+(.*)", line)
            if m:
                out.append("\n" + m.group(2) + "\n")
            continue
        if in_pod:
            out.append(line)
    text = "\n".join(out)
    text = re.sub(r"E<lt>", "<", text)
    text = re.sub(r"E<gt>", ">", text)
    text = re.sub(r"E<[^<>]*>", "", text)
    for _ in range(3):
        text = POD_CODE.sub(lambda m: _pod_link(m.group(1) if m.group(1) is not None else m.group(2)), text)
    return text


def _pod_link(s):
    if "|" in s:
        s = s.split("|", 1)[0]
    return s.replace('/"', " ").replace('"', "")


def asciidoc_text(raw):
    lines = []
    for line in raw.splitlines():
        if re.match(r"^(ifdef|ifndef|endif|include)::", line) or re.match(r"^[-=~^+.*_/]{4,}\s*$", line):
            continue
        if re.match(r"^\[\[.*\]\]$|^\[.*\]$|^:[a-z-]+:", line):
            continue
        line = re.sub(r"linkgit:([\w-]+)\[(\d)\]", r"\1(\2)", line)
        line = re.sub(r"\b(?:link|https?)[:][^\s\[]*\[([^\]]*)\]", r"\1", line)
        line = re.sub(r"`([^`]*)`", r"\1", line)
        line = re.sub(r"'([^'\s][^']*)'", r"\1", line)
        lines.append(line)
    return "\n".join(lines)


def fortune_docs(raw, name):
    """Groups consecutive fortunes into documents of about 2 KB."""
    items = [f.strip("\n") for f in re.split(r"(?m)^%\s*$", raw)]
    items = [f for f in items if f.strip()]
    docs, cur, size = [], [], 0
    for f in items:
        cur.append(f)
        size += len(f)
        if size >= 2000:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def read(path):
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    return data.decode("utf-8", errors="replace")


def normalize(text, keep_lines):
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = text.replace("\u00a0", " ").replace("\u00b6", "").replace("\ufffd", "")
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    paras = []
    for para in re.split(r"\n\s*\n", text):
        lines = [l.rstrip() for l in para.split("\n")]
        while lines and not lines[0].strip():
            lines.pop(0)
        if not lines:
            continue
        if keep_lines:
            indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
            para = "\n".join(l[indent:] for l in lines)
        else:
            para = " ".join(l.strip() for l in lines if l.strip())
            para = re.sub(r" {2,}", " ", para)
        paras.append(para)
    return paras


def good_paragraph(p):
    letters = sum(c.isalpha() for c in p)
    if letters < 0.45 * len(p) or len(p) < 2:
        return False
    ascii_letters = sum(("a" <= c <= "z") or ("A" <= c <= "Z") for c in p)
    return ascii_letters >= 0.9 * letters


def chunks(paras):
    """Splits a long text at paragraph boundaries into documents of at most
    about CHUNK characters, so that no single file dominates either split."""
    out, cur, size = [], [], 0
    for p in paras:
        cur.append(p)
        size += len(p) + 2
        if size >= CHUNK:
            out.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        out.append("\n\n".join(cur))
    return [d.replace(RS, "") for d in out if len(d) >= 200]


def package_files(pkg):
    out = subprocess.run(["dpkg", "-L", pkg], check=True, capture_output=True, text=True).stdout
    return sorted(p for p in out.splitlines() if os.path.isfile(p) and not os.path.islink(p))


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    seen = set()
    docs, stats = [], {}
    for pkg, rules in SOURCES.items():
        n_docs = n_chars = 0
        for path in package_files(pkg):
            for pattern, kind in rules:
                if not re.search(pattern, path):
                    continue
                raw = read(path)
                if kind == "fortune":
                    texts, keep = fortune_docs(raw, path), True
                elif kind == "html":
                    texts, keep = [html_text(raw)], False
                elif kind == "pod":
                    texts, keep = [pod_text(raw)], False
                elif kind == "asciidoc":
                    texts, keep = [asciidoc_text(raw)], False
                else:
                    texts, keep = [raw], True
                for t in texts:
                    paras = []
                    for p in normalize(t, keep):
                        key = hashlib.sha1(p.encode()).digest()
                        if len(p) > 40 and key in seen:
                            continue
                        if not good_paragraph(p):
                            continue
                        seen.add(key)
                        paras.append(p)
                    for doc in chunks(paras):
                        docs.append(doc)
                        n_docs += 1
                        n_chars += len(doc)
                break
        stats[pkg] = {"documents": n_docs, "characters": n_chars}
        print(f"{pkg:22s} {n_docs:6d} documents {n_chars / 1e6:8.2f} M characters", flush=True)
    train, valid = [], []
    for d in docs:
        h = int.from_bytes(hashlib.sha256(d.encode()).digest()[:8], "big")
        (valid if h % 1000 < VALID_PER_MILLE else train).append(d)
    rng = random.Random(SEED)
    train.sort()
    valid.sort()
    rng.shuffle(train)
    rng.shuffle(valid)
    for name, part in (("train", train), ("valid", valid)):
        with open(os.path.join(out_dir, name + ".txt"), "w", encoding="utf-8", newline="\n") as f:
            f.write(("\n" + RS + "\n").join(part) + "\n")
    stats["_total"] = {"train_documents": len(train), "valid_documents": len(valid),
                       "train_bytes": os.path.getsize(os.path.join(out_dir, "train.txt")),
                       "valid_bytes": os.path.getsize(os.path.join(out_dir, "valid.txt"))}
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats["_total"]))


if __name__ == "__main__":
    main()
