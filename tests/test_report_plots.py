"""The report's figures, measured: sizes in pixels, room around the bars, axis labels, tick
label sizes, and legends that name every line drawn and nothing that is not drawn."""

import json
import math
import struct

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from test_report_claims import ENV, make_experiment  # noqa: E402

from reflectrl.report import plots  # noqa: E402
from reflectrl.report.analysis import identical_entries, load_experiment  # noqa: E402
from reflectrl.report.render import write_report  # noqa: E402
from reflectrl.signals.calibration.plot import calibration_figure  # noqa: E402

MIN_TICK_POINTS = 8


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])  # IHDR: width, height


def fake_table(n: int) -> list[dict]:
    return [{"env": ENV, "algo": f"algo{i}", "seeds": 5, "final_iqm": float(i), "final_ci": [i - 1.0, i + 1.0]}
            for i in range(n)]


def visible_axes(fig):
    return [ax for ax in fig.axes if ax.axison]


def drawn(line) -> bool:
    """A line shows something: a finite point with a marker, or two finite points joined."""
    x, y = (np.asarray(v, dtype=float) for v in line.get_data())
    finite = int(np.sum(np.isfinite(x) & np.isfinite(y)))
    has_marker = line.get_marker() not in (None, "None", "", " ")
    has_line = line.get_linestyle() not in ("None", "", " ") and line.get_linewidth() > 0
    return (finite >= 1 and has_marker) or (finite >= 2 and has_line)


def legend_entries(legend) -> dict:
    return {text.get_text(): handle for text, handle in zip(legend.get_texts(), legend.legend_handles)}


def assert_readable_ticks(fig):
    fig.canvas.draw()
    for ax in visible_axes(fig):
        for label in ax.get_xticklabels() + ax.get_yticklabels():
            if label.get_text():
                assert label.get_fontsize() >= MIN_TICK_POINTS, (ax.get_title(), label.get_text())


# ----------------------------------------------------------------- final-return intervals

@pytest.mark.parametrize("n", [1, 3, 8])
def test_final_intervals_grow_with_entries_and_bars_clear_the_frame(n):
    fig = plots.final_intervals_figure(fake_table(n), ENV)
    fig.canvas.draw()
    (ax,) = fig.axes
    box = ax.get_window_extent()
    assert box.height >= max(90, 40 * n), box.height  # was about 45 px for one entry
    assert_readable_ticks(fig)
    bars = [line for line in ax.get_lines() if line.get_linewidth() >= 8]
    assert len(bars) == n
    for bar in bars:
        half = bar.get_linewidth() * fig.dpi / 72 / 2  # the bar's half thickness in pixels
        (x0, y), (x1, _) = ax.transData.transform(np.column_stack(bar.get_data()))
        assert box.y0 + half + 5 <= y <= box.y1 - half - 5, (y, box)  # room above and below
        assert box.x0 + 5 <= x0 and x1 <= box.x1 - 5, (x0, x1, box)  # and at either end


def test_final_intervals_show_each_seed_on_its_entry_row():
    rows = fake_table(2)
    rows[0]["final_seeds"], rows[1]["final_seeds"] = [0.1, -0.5, 0.7], [1.5, 1.2]
    fig = plots.final_intervals_figure(rows, ENV)
    points = [line for line in fig.axes[0].get_lines() if line.get_marker() == "o"]
    assert [sorted(line.get_xdata()) for line in points] == [[-0.5, 0.1, 0.7], [1.2, 1.5]]
    for i, line in enumerate(points):  # on the entry's row, spread within it
        assert np.all(np.abs(np.asarray(line.get_ydata()) - i) <= 0.2)


def test_final_intervals_height_is_per_entry_and_the_png_matches():
    heights = [plots.final_intervals_figure(fake_table(n), ENV).get_size_inches()[1] for n in (1, 2, 6)]
    assert heights[1] - heights[0] == pytest.approx(plots.ROW_INCHES)
    assert heights[2] - heights[1] == pytest.approx(4 * plots.ROW_INCHES)
    width, height = png_size(plots.final_intervals(fake_table(6), ENV))
    assert (width, height) == (round(6.4 * plots.DPI), round(heights[2] * plots.DPI))


@pytest.mark.parametrize("env_id", [ENV, "BabyAI-GoToRedBall-v0", "MiniGrid-KeyCorridorS3R3-v0",
                                    "navix:Navix-DoorKey-Random-16x16-v0"])
@pytest.mark.parametrize("label", [None, "ppo+shaping[mode=potential]"])  # a long label pushes the axes right
def test_final_intervals_title_fits_with_the_few_seeds_note(env_id, label):
    rows = [{**row, "env": env_id, "seeds": 2} for row in fake_table(3)]
    if label:
        rows[0]["algo"] = label
    fig = plots.final_intervals_figure(rows, env_id)
    fig.canvas.draw()
    title = fig._suptitle
    assert "seeds' range" in title.get_text()
    box, frame = title.get_window_extent(), fig.bbox
    assert box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1


# --------------------------------------------------------------------------- diagnostics

DEMO_ALGOS = ["ppo", "refgrpo", "refgrpo[bonus_target=seed]", "sdrs", "sdrs[mode=potential]", "gear",
              "gear[temperature=inf]"]  # the demo's entries


@pytest.fixture
def experiment(tmp_path):
    """Every entry logs entropy (ppo nothing else); the others also log their own diagnostics."""
    curves = {label: [[float(i) for i in range(20)]] * 2 for label in DEMO_ALGOS}
    own = {"refgrpo": {"calibration_loss": lambda i: 1 - i / 40}, "sdrs": {"shaping_to_reward": lambda i: 0.1 * i},
           "gear": {"weights_mean": lambda i: 1.0 + 0.01 * i, "weights_std": lambda i: 0.1 * i}}
    extra = {label: [[{k: f(i) for k, f in own[label.split("[")[0]].items()} for i in range(20)]] * 2
             for label in DEMO_ALGOS[1:]}
    return load_experiment(make_experiment(tmp_path / "exp", curves, total_steps=1_000_000, extra=extra))


def test_diagnostics_panels_are_labelled_and_readable(experiment):
    keys = plots.diagnostic_keys(experiment)
    assert set(keys) == {"calibration_loss", "shaping_to_reward", "weights_mean", "weights_std"}
    fig = plots.diagnostics_figure(experiment, ENV, keys)
    panels = visible_axes(fig)
    assert [ax.get_title() for ax in panels] == keys + ["entropy"]
    assert all(ax.get_xlabel() == "env steps" for ax in panels)
    assert_readable_ticks(fig)


def test_diagnostics_legend_names_every_line_drawn(experiment):
    fig = plots.diagnostics_figure(experiment, ENV, plots.diagnostic_keys(experiment))
    fig.canvas.draw()
    (legend,) = fig.legends
    entries = legend_entries(legend)
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    entropy = next(ax for ax in fig.axes if ax.get_title() == "entropy")
    assert {line.get_label() for line in entropy.get_lines()} == set(DEMO_ALGOS)  # ppo is drawn only here
    for line in lines:
        assert line.get_label() in entries, line.get_label()
        assert entries[line.get_label()].get_color() == line.get_color()
    assert sorted(entries) == sorted(DEMO_ALGOS)  # and nothing else
    assert all(text.get_fontsize() >= MIN_TICK_POINTS for text in legend.get_texts())

    # the legend is on the figure and hides neither the title nor any panel
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
    assert not box.overlaps(fig._suptitle.get_window_extent(renderer))
    for ax in visible_axes(fig):
        assert not box.overlaps(ax.get_tightbbox(renderer)), ax.get_title()


def test_learning_curves_legend_and_labels(experiment):
    fig = plots.learning_curves_figure(experiment, ENV)
    (ax,) = fig.axes
    assert ax.get_xlabel() == "env steps"
    entries = legend_entries(ax.get_legend())
    assert sorted(entries) == sorted(line.get_label() for line in ax.get_lines())
    assert_readable_ticks(fig)


# ---------------------------------------------------------------------- calibration plot

def _rows(n, heldout=lambda i: 0.9, prev=lambda i: 0.8 if i else None):
    return [{"global_step": 100 * (i + 1), "calibration_loss": 1 - 0.01 * i, "calibration_loss_heldout": heldout(i),
             "calibration_loss_prev_batch": prev(i)} for i in range(n)]


@pytest.mark.parametrize("rows, shown", [
    (_rows(1), {"train (after fit)", "fresh batch (before fit)"}),  # no previous batch yet
    (_rows(2), {"train (after fit)", "fresh batch (before fit)", "previous batch"}),  # previous batch: one point
    (_rows(5, heldout=lambda i: math.nan), {"train (after fit)", "previous batch"}),  # nothing finite to draw
    (_rows(5), {"train (after fit)", "fresh batch (before fit)", "previous batch"}),
])
def test_calibration_legend_has_no_entry_without_a_drawn_line(rows, shown):
    snapshots = [{"iteration": 1, "target": [-1.0, 0.0, 1.0], "prediction": [-0.5, 0.1, 0.4]}]
    fig = calibration_figure("reflectrl/GridWorld-v0", snapshots, rows)
    ax = fig.axes[-1]
    entries = legend_entries(ax.get_legend())
    assert set(entries) == shown | {"knows nothing (=1)"}
    by_label = {line.get_label(): line for line in ax.get_lines()}
    for label in entries:
        assert label in by_label and drawn(by_label[label]), label
    assert ax.get_xlabel() == "env steps"


def test_the_demos_curves_are_split_into_panels_each_against_its_baseline(tmp_path):
    algos = ["ppo", "ppo+count", "ppo+rnd", "ppo+calibration", "ppo+shaping[mode=potential]", "ppo+gear",
             "ppo+count+calibration", "ppo+count+shaping[mode=potential]", "ppo+count+gear"]
    curves = {label: [[float(i + k) for i in range(20)]] * 2 for k, label in enumerate(algos)}
    exp = load_experiment(make_experiment(tmp_path / "exp", curves, total_steps=100_000))
    panels = plots.curve_panels(exp)
    assert [title for title, _, _ in panels] == ["baselines", "each signal alone (vs ppo)",
                                                 "each signal on ppo+count (vs ppo+count)"]
    assert panels[2][1] == ["ppo+count", "ppo+count+calibration", "ppo+count+shaping[mode=potential]",
                            "ppo+count+gear"]
    fig = plots.learning_curves_figure(exp, ENV)
    drawn = [ax for ax in fig.axes if ax.get_lines()]
    assert len(drawn) == 3 and all(len(ax.get_lines()) <= 4 for ax in drawn)  # no panel is a tangle
    assert_readable_ticks(fig)


def test_a_panel_of_many_entries_bands_only_its_baseline(experiment):
    fig = plots.learning_curves_figure(experiment, ENV)  # 7 entries, none stacked: one panel
    (ax,) = fig.axes
    assert len(ax.get_lines()) == len(DEMO_ALGOS) and len(ax.collections) == 1  # ppo's band only


# ------------------------------------------------------------- titles and legends on the figure

def inside(box, fig) -> bool:
    frame = fig.bbox
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


@pytest.mark.parametrize("env_id", [ENV, "navix:Navix-DoorKey-5x5-v0", "navix:Navix-DoorKey-Random-16x16-v0"])
@pytest.mark.parametrize("algos", [
    ["ppo"],  # one diagnostics panel (entropy): a 4.2-inch figure
    ["ppo", "ppo+count", "ppo+gear", "ppo+rnd", "ppo+shaping[mode=potential]"],  # "; bands for the baselines only"
    ["ppo", "ppo+count", "ppo+gear", "ppo+count+gear"],  # panels, under one figure title
])
def test_curve_diagnostics_and_exploration_titles_and_legends_fit_the_figure(tmp_path, env_id, algos):
    """A long env id with the title's note ran off both ends of the figure (the curves of five
    entries on navix:Navix-DoorKey-5x5-v0, the one-panel diagnostics of any long id)."""
    curves = {label: [[float(i + k) for i in range(20)]] * 2 for k, label in enumerate(algos)}
    exp = load_experiment(make_experiment(tmp_path / "exp", curves, envs=(env_id,)))
    figures = [plots.learning_curves_figure(exp, env_id), plots.diagnostics_figure(exp, env_id, []),
               plots.exploration_figure(exp, env_id)]
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        # the figure's title, wherever it is put (a one-panel figure's could be its axes' title)
        (title,) = [t for t in [fig._suptitle, *(ax.title for ax in fig.axes)] if t and env_id in t.get_text()]
        box = title.get_window_extent(renderer)
        assert inside(box, fig), (title.get_text(), box, fig.bbox)
        for ax in visible_axes(fig):
            assert title is ax.title or not box.overlaps(ax.get_window_extent(renderer)), title.get_text()
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        assert legends and all(inside(legend.get_window_extent(renderer), fig) for legend in legends)


# ------------------------------------------------------------------- entries with identical runs

def pixels_of(fig, color) -> int:
    """How many pixels of the drawn figure are exactly this colour."""
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    want = np.array(matplotlib.colors.to_rgb(color)) * 255
    return int((np.abs(rgb - want) <= 1).all(axis=-1).sum())


def test_an_entry_identical_to_another_is_named_and_drawn_so_both_show(tmp_path):
    """ppo+count and ppo+rnd log ppo's returns seed by seed: drawn plainly, the last one drawn
    hid the others, whose colours were in the legend only."""
    same = [[float(i) for i in range(20)], [float(2 * i) for i in range(20)]]
    curves = {"ppo": same, "ppo+count": same, "ppo+gear": [[float(i + 3) for i in range(20)]] * 2, "ppo+rnd": same}
    root = make_experiment(tmp_path / "exp", curves)
    exp = load_experiment(root)
    assert identical_entries(exp, ENV) == {"ppo+count": "ppo", "ppo+rnd": "ppo"}
    fig = plots.learning_curves_figure(exp, ENV)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["ppo (2 seeds)", "ppo+count (2 seeds; identical to ppo)", "ppo+gear (2 seeds)",
                           "ppo+rnd (2 seeds; identical to ppo)"]
    ax.get_legend().remove()  # count each colour in the plot, not in the legend
    for label, line in lines.items():
        assert pixels_of(fig, line.get_color()) > 50, label

    with pytest.warns(UserWarning):  # 2 seeds
        write_report(root, reps=200)
    md = (root / "report" / "report.md").read_text()
    assert f"ppo+count = ppo on {ENV}; ppo+rnd = ppo on {ENV}" in md
    assert json.loads((root / "report" / "stats.json").read_text())["identical"] == {
        ENV: {"ppo+count": "ppo", "ppo+rnd": "ppo"}}


def test_runs_that_differ_in_one_seed_are_not_identical(tmp_path):
    curves = {"ppo": [[1.0] * 20, [2.0] * 20], "ppo+count": [[1.0] * 20, [2.0] * 19 + [2.5]]}
    assert identical_entries(load_experiment(make_experiment(tmp_path / "exp", curves)), ENV) == {}


# --------------------------------------------------------------------------- flat diagnostics

def test_flat_diagnostics_are_not_drawn_and_the_report_names_them(tmp_path):
    """A neutral signal's bonus at 0 and an alpha held fixed drew a panel of flat lines each."""
    rising = [[float(i) for i in range(20)]] * 5
    gear = [[{"verdict_bonus": 0.0, "alpha": 0.0, "weights_std": 0.1 * i} for i in range(20)]] * 5
    calibration = [[{"alpha": 0.5} for _ in range(20)]] * 5
    root = make_experiment(tmp_path / "exp", {"ppo": rising, "ppo+gear": rising, "ppo+calibration": rising},
                           extra={"ppo+gear": gear, "ppo+calibration": calibration})
    exp = load_experiment(root)
    keys = plots.diagnostic_keys(exp)
    assert keys == ["verdict_bonus", "alpha", "weights_std"]
    fig = plots.diagnostics_figure(exp, ENV, keys)
    assert [ax.get_title() for ax in visible_axes(fig)] == ["weights_std", "entropy"]

    write_report(root, reps=200)
    line = "constant, not drawn: verdict_bonus 0; alpha 0 (ppo+gear), 0.5 (ppo+calibration)"
    assert line in (root / "report" / "report.md").read_text()
    assert line in (root / "report" / "index.html").read_text()


def test_a_diagnostics_figure_of_flat_lines_only_is_left_out(tmp_path):
    flat = [[{"entropy": 0.5} for _ in range(20)]] * 5
    root = make_experiment(tmp_path / "exp", {"ppo": [[float(i) for i in range(20)]] * 5}, extra={"ppo": flat})
    assert plots.diagnostics_figure(load_experiment(root), ENV, []) is None
    write_report(root, reps=200)
    assert not list((root / "report").glob("diagnostics_*.png"))
    md = (root / "report" / "report.md").read_text()
    assert f"### {ENV}: diagnostics\n\nconstant, not drawn: entropy 0.5\n" in md
