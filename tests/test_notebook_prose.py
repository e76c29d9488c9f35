"""A figure the prose quotes is one a cell shows: how the check reads a notebook.

The check itself runs on every executed notebook in ``tests/test_notebooks.py`` (one
execution per notebook serves every check); these tests pin what counts as a figure.
"""

import nbformat

from tests.notebook_prose import prose_figures, unshown_figures


def _notebook(markdown: str, printed: str, code: str = "print(x)"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(code)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    nb.cells = [nbformat.v4.new_markdown_cell(markdown), cell]
    return nb


def test_a_figure_is_a_number_with_a_unit_and_names_and_products_are_not():
    text = ("ZeRO-2 takes 19.66 ms, 13-36% more, 1.46x, 66.2 TFLOP/s, 42,855 tokens/s and 2 s; "
            "8 x A100-40GB GPUs, 16 layers, [a link](../docs/x.md#50-ms)")
    assert prose_figures(text) == ["19.66 ms", "13-36%", "1.46x", "66.2 TFLOP/s", "42,855 tokens/s", "2 s"]


def test_a_figure_no_cell_shows_is_reported_and_one_a_cell_prints_is_not():
    nb = _notebook("The update takes 12 ms under both; the step 19.66 ms.", "step 19.66 ms\n")
    assert unshown_figures(nb) == [(0, "12 ms")]


def test_a_range_passes_only_when_both_ends_are_shown_and_commas_do_not_matter():
    assert unshown_figures(_notebook("between 1,600 and 13-36%", "+13% and +36%, 1600 s")) == []
    assert unshown_figures(_notebook("about 13-36%", "+13% and +25%")) == [(0, "13-36%")]
    # A share is shown as a share: a bare 36 (a layer count, a column width) is not 36%.
    assert unshown_figures(_notebook("about 36%", "36 layers")) == [(0, "36%")]


def test_a_number_in_the_code_counts_as_shown():
    assert unshown_figures(_notebook("each stall is 50 ms", "", code="stall_ms = 50")) == []
