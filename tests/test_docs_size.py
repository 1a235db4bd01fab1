"""The pictures under docs/ stay small (issue 37): at most 6 MB in all, so a clone stays light."""

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".svg"}
LIMIT_BYTES = 6_000_000


def test_docs_images_total_at_most_6_mb():
    images = [p for p in DOCS.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    assert images, f"no images found under {DOCS}"
    sizes = {p: p.stat().st_size for p in images}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= LIMIT_BYTES, (
        f"images under docs/ total {total:,} bytes > {LIMIT_BYTES:,}; largest: "
        + ", ".join(f"{p.relative_to(DOCS)} ({sizes[p]:,})" for p in largest))
