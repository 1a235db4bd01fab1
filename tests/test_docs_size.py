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


def test_new_pictures_come_out_small():
    """What the report writes: a paletted PNG, at its dpi when small; a tall grid of panels (the
    diagnostics of a run logging dozens of metrics) at a lower dpi, capped in pixels."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from reflectrl.report import plots

    def saved(figsize):
        fig, axes = plt.subplots(1, 1, figsize=figsize)
        axes.plot(range(10), [v * v for v in range(10)])
        return Image.open(io.BytesIO(plots.png_bytes(fig)))

    small = saved((6.4, 4.0))
    assert small.mode == "P" and small.size == (round(6.4 * plots.DPI), round(4.0 * plots.DPI))
    tall = saved((12.6, 36.0))  # 18 rows of 3 panels at 100 dpi: 1260x3600 px
    assert tall.mode == "P" and tall.size[0] * tall.size[1] <= plots.MAX_PIXELS * 1.01
    assert tall.size[0] >= 12.6 * plots.MIN_DPI  # not shrunk below MIN_DPI
