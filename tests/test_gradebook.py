"""The gradebook beside grade's CSV (classroom/gradebook.py), and the grader's rules that feed it: check calls found
in the syntax tree, predictions bound by parameter name, answers defined inside a check cell, unchanged written
prompts, the CSV's lock and no silent replacement of an earlier batch.

Gradescope's autograder format (https://gradescope-autograders.readthedocs.io/en/latest/specs/): the fields of
results.json and of each test, as published there.
"""

import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_grade import notebook_file

from minidape import exercises, grade
from minidape.classroom import gradebook

EDITIONS = grade.editions()
GRADESCOPE_TOP = {
    "score",
    "execution_time",
    "output",
    "output_format",
    "test_output_format",
    "test_name_format",
    "visibility",
    "stdout_visibility",
    "extra_data",
    "tests",
    "leaderboard",
}
GRADESCOPE_TEST = {
    "score",
    "max_score",
    "status",
    "name",
    "name_format",
    "number",
    "output",
    "output_format",
    "tags",
    "visibility",
    "extra_data",
}


def submission(student, notebook, rows, written=()):
    return grade.Submission(student, Path(f"{notebook}.ipynb"), notebook, rows=list(rows), written=list(written))


def rows_of(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


# ------------------------------------------------------------------------------------------ spreadsheets


def test_every_field_is_neutralised_for_spreadsheets(tmp_path):
    hostile = submission(
        "=HYPERLINK(\"http://x\")",
        "02_kerple_cpd_kernels",
        [grade.Row("find_shift", 0, 2, exercises.FAILED, "-1 is not a shift", "code")],
        [grade.Written("shift_growth", "@SUM(A1:A9)"), grade.Written("shift_growth", "+cmd|' /C calc'!A0")],
    )
    out = tmp_path / "grades.csv"
    gradebook.write_csv([hostile], out)
    gradebook.write_written([hostile], gradebook.written_path(out))
    (row,) = rows_of(out)
    assert row["student"] == "'=HYPERLINK(\"http://x\")" and row["points"] == "0"
    assert row["message"].startswith("failed")  # the verdict opens it: nothing to escape there
    written = rows_of(gradebook.written_path(out))
    assert [w["answer"] for w in written] == ["'@SUM(A1:A9)", "'+cmd|' /C calc'!A0"]
    for text in ("=1+2", "+1", "-1", "@x", "\tx", "\rx"):
        assert gradebook.spreadsheet_safe(text) == "'" + text
    assert gradebook.spreadsheet_safe("ann") == "ann" and gradebook.spreadsheet_safe(-1.5) == "-1.5"


# ---------------------------------------------------------------------- totals, summary, marks, export


def batch(tmp_path):
    """Two students of notebook 02, graded: ann right but one mistake, bob the same mistake and an empty answer."""
    wrong = "not yet right: for 3 random points ... one doubling too many"
    graded = [
        submission(
            "ann",
            "02_kerple_cpd_kernels",
            [
                grade.Row("square_quadratic_form", 2, 2, exercises.PASSED, "passed, 2 of 2 points"),
                grade.Row("find_shift", 0, 2, exercises.FAILED, wrong, "one-doubling-too-many"),
            ],
            [grade.Written("shift_growth", "c grows linearly for the triangle")],
        ),
        submission(
            "bob",
            "02_kerple_cpd_kernels",
            [
                grade.Row("square_quadratic_form", 0, 2, exercises.NOT_DONE, "not done yet", "not-done"),
                grade.Row("find_shift", 0, 2, exercises.FAILED, wrong.replace("3", "17"), "one-doubling-too-many"),
            ],
            [grade.Written("shift_growth", "**Your answer** ...", gradebook.NOT_ANSWERED)],
        ),
        submission(
            "bob",
            "06_your_own_bias",
            [grade.Row("best_run", 0, 2, exercises.NEEDS_FULL, "not judged in quick mode", "needs-full-mode")],
        ),
    ]
    out = tmp_path / "grades.csv"
    gradebook.write_csv(graded, out)
    gradebook.write_written(graded, gradebook.written_path(out))
    return graded, out


def test_totals_summary_and_written_marks_folded_in_without_grading(tmp_path):
    _, out = batch(tmp_path)
    gradebook.gradebook(out)
    totals = {row["student"]: row for row in rows_of(gradebook.sibling(out, "totals"))}
    assert totals["ann"]["02_kerple_cpd_kernels"] == "2" and totals["ann"]["total"] == "2"
    assert totals["ann"]["max_total"] == "6" and totals["ann"]["written_to_mark"] == "1"
    assert totals["bob"]["06_your_own_bias"] == "0" and totals["bob"]["not_judged"] == "1"
    assert totals["ann"]["06_your_own_bias"] == ""  # ann handed in no 06
    summary = {row["exercise"]: row for row in rows_of(gradebook.sibling(out, "summary"))}
    assert summary["find_shift"]["common_mistakes"] == "one-doubling-too-many (2)"
    assert summary["square_quadratic_form"]["mean_points"] == "1" and summary["find_shift"]["share_passed"] == "0"
    assert (
        summary["best_run"]["judged"] == "0" and summary["rubric:shift_growth"]["common_mistakes"] == "not-answered (1)"
    )
    # the teacher marks ann's written answer; the gradebook is rebuilt from the files, nothing graded again
    written = rows_of(gradebook.written_path(out))
    written[0]["points"] = "1.5"
    with open(gradebook.written_path(out), "w", newline="") as file:
        writer = csv.DictWriter(file, gradebook.WRITTEN_COLUMNS)
        writer.writeheader()
        writer.writerows(written)
    done = subprocess.run(
        [sys.executable, "-m", "minidape", "grade", "--gradebook", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    totals = {row["student"]: row for row in rows_of(gradebook.sibling(out, "totals"))}
    assert totals["ann"]["total"] == "3.5" and totals["ann"]["written_to_mark"] == "0"
    summary = {row["exercise"]: row for row in rows_of(gradebook.sibling(out, "summary"))}
    assert summary["rubric:shift_growth"]["mean_points"] == "1.5"


def test_a_mark_outside_the_rubric_is_one_line_and_exit_2(tmp_path):
    _, out = batch(tmp_path)
    text = gradebook.written_path(out).read_text().replace(",,2\n", ",7,2\n", 1)
    gradebook.written_path(out).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "minidape", "grade", "--gradebook", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "outside 0 .. 2" in done.stderr


def test_the_gradescope_export_uses_the_published_field_names(tmp_path):
    _, out = batch(tmp_path)
    gradebook.gradebook(out)
    files = sorted(gradebook.sibling(out, "gradescope").rglob("results.json"))
    assert [f.relative_to(gradebook.sibling(out, "gradescope")).parts[:2] for f in files] == [
        ("02_kerple_cpd_kernels", "ann"),
        ("02_kerple_cpd_kernels", "bob"),
        ("06_your_own_bias", "bob"),
    ]
    results = json.loads(files[0].read_text())
    assert set(results) <= GRADESCOPE_TOP and {"score", "tests"} <= set(results)
    assert results["score"] == 2
    for test in results["tests"]:
        assert set(test) <= GRADESCOPE_TEST and {"name", "score", "max_score", "output"} <= set(test)
        assert test["status"] in ("passed", "failed")
    assert [t["name"] for t in results["tests"]] == [
        "square_quadratic_form",
        "find_shift",
        "written answer (rubric:shift_growth)",
    ]


# ---------------------------------------------------------------------------- the lock, no overwrite


def test_a_second_run_into_the_same_csv_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "grades.csv"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom minidape.classroom import gradebook\n"
                f"with gradebook.held({str(out)!r}, overwrite=False):\n"
                "    print('held', flush=True)\n    time.sleep(60)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=f"another grade run \\(pid {holder.pid} on "):
            with gradebook.held(out, overwrite=False):
                pass
    finally:
        holder.kill()
        holder.wait()
    with gradebook.held(out, overwrite=False):  # released when its holder ended
        pass


def test_an_earlier_batch_is_never_replaced_without_overwrite_and_marks_survive_it(tmp_path):
    graded, out = batch(tmp_path)
    with pytest.raises(ValueError, match="earlier batch's grades.*--overwrite"):
        with gradebook.held(out, overwrite=False):
            pass
    text = gradebook.written_path(out).read_text().replace(",,2\n", ",2,2\n", 1)  # ann's answer marked 2
    gradebook.written_path(out).write_text(text)
    graded[1].written = [grade.Written("shift_growth", "now bob wrote something")]  # bob answered since
    graded[1].written[0].problem = ""
    with gradebook.held(out, overwrite=True) as entered:
        gradebook.write_written(graded, gradebook.written_path(out), entered)
    points = {(w["student"], w["answer"]): w["points"] for w in rows_of(gradebook.written_path(out))}
    assert points == {("ann", "c grows linearly for the triangle"): "2", ("bob", "now bob wrote something"): ""}


def test_the_cli_refuses_an_earlier_batch_in_one_line(tmp_path):
    _, out = batch(tmp_path)
    before = out.read_text()
    done = subprocess.run(
        [sys.executable, "-m", "minidape", "grade", str(tmp_path / "nothing.ipynb"), "--csv", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert out.read_text() == before


# ------------------------------------------------------------------------------ the grader's rules


def test_a_check_mentioned_in_a_comment_is_not_a_check_cell():
    edition = EDITIONS["01"]
    answer = {
        "cell_type": "code",
        "tags": [],
        "source": (
            "# like the bias of exercises.check(\"alibi_bias\", ...) asks:\n"
            "def alibi_bias(n_head, q_pos, k_pos):\n    return None  # 'check(\"alibi_bias\"' in a string too\n"
        ),
    }
    restored = grade.restore(edition, [answer])
    assert answer["source"] in [cell["source"] for cell in restored]
    assert grade.checked(answer["source"]) == []
    assert grade.checked('exercises.check(name="alibi_bias", your_function=f)') == ["alibi_bias"]
    assert grade.checked("if False:\n    exercises.check('alibi_bias', f)") == ["alibi_bias"]  # dead, still a call


def test_an_answer_defined_inside_a_check_cell_is_named():
    edition = EDITIONS["05"]
    inside = {
        "cell_type": "code",
        "tags": [],
        "source": (
            "def receptive_keys(i, j, k):\n    return list(range(j, i + 1))\n\n"
            "exercises.check(\"receptive_keys\", receptive_keys)\n"
        ),
    }
    assert grade.defined_in_check_cells(edition, [inside]) == {"receptive_keys": ["receptive_keys"]}
    alone = {**inside, "source": 'exercises.check("receptive_keys", receptive_keys)'}
    assert grade.defined_in_check_cells(edition, [alone]) == {"receptive_keys": []}


def test_an_unchanged_written_prompt_is_not_answered():
    edition = EDITIONS["03"]
    kept = [dict(cell) for cell in edition.cells if "solution" not in cell["tags"]]
    (unchanged,) = grade.written_answers(edition, kept)
    assert unchanged.problem == gradebook.NOT_ANSWERED
    for cell in kept:
        if "written" in cell["tags"]:
            cell["source"] += "\nRoPE's ratio was 2.5 in my run."
    (answered,) = grade.written_answers(edition, kept)
    assert answered.problem == ""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the sandbox needs Linux")
def test_fair_answers_through_the_worker_and_the_answer_in_a_check_cell(tmp_path, monkeypatch):
    """Graded for real (quick mode): receptive_keys as a range, a set and a numpy array come back from the worker
    as handles and pass; the answer written inside the check cell gets the note that says how to fix it."""
    monkeypatch.setenv("MINIDAPE_QUICK", "1")
    edition = EDITIONS["05"]
    # Only the cells up to receptive_keys' check: the rest of 05 (its refiner's training, 5.3's runs) plays no part
    # in that verdict, and the grader's rows for the exercises after it are not what this test reads.
    last = next(i for i, c in enumerate(edition.cells) if grade.checked(c["source"]) == ["receptive_keys"])
    edition = dataclasses.replace(edition, cells=edition.cells[: last + 1])
    stub = "exercises.todo()                      # your code here"
    reach = "max(0, j - 2 * (k // 2)), min(i, j + 2 * (k // 2)) + 1"
    returns = {"range": f"range({reach})", "set": f"set(range({reach}))", "array": f"np.arange({reach})"}
    for student, value in returns.items():
        cells = []
        for cell in edition.cells:
            if "solution" in cell["tags"]:
                continue
            source = cell["source"]
            if "def receptive_keys" in source and stub in source:
                source = "import numpy as np\n" + source.replace(stub, f"return {value}")
            cells.append({**cell, "source": source})
        notebook_file(tmp_path / "work" / student / f"{edition.stem}.ipynb", cells)
    inside = []
    for cell in edition.cells:
        if "solution" in cell["tags"]:
            continue
        if "def receptive_keys" in cell["source"]:
            continue  # moved into the check cell below
        source = cell["source"]
        if grade.checked(source) == ["receptive_keys"]:
            source = f"def receptive_keys(i, j, k):\n    return list(range({reach}))\n\n" + source
        inside.append({**cell, "source": source})
    notebook_file(tmp_path / "work" / "zoe" / f"{edition.stem}.ipynb", inside)
    # eve saved her definition below its check but ran it first, as the execution counts show: judged in the
    # order she ran her cells, it counts (issue 47: 0 / 2 before)
    below = []
    for cell in edition.cells:
        if "solution" not in cell["tags"] and "def receptive_keys" not in cell["source"]:
            below.append({**cell})
            if grade.checked(cell["source"]) == ["receptive_keys"]:
                definition = f"def receptive_keys(i, j, k):\n    return list(range({reach}))\n"
                below.append({"cell_type": "code", "source": definition, "tags": []})
    ran = [c for c in below if c["cell_type"] == "code" and c["source"].strip()]
    for count, cell in enumerate(ran, 1):
        cell["execution_count"] = count
    at = next(i for i, c in enumerate(ran) if grade.checked(c["source"]) == ["receptive_keys"])
    ran[at]["execution_count"], ran[at + 1]["execution_count"] = at + 2, at + 1  # the definition ran first
    notebook_file(tmp_path / "work" / "eve" / f"{edition.stem}.ipynb", below)
    graded = grade.grade([tmp_path / "work"], timeout=300, jobs=2)
    rows = {(s.student, r.exercise): r for s in graded for r in s.rows}
    for student in returns:
        assert rows[student, "receptive_keys"].status == exercises.PASSED, rows[student, "receptive_keys"].message
    assert rows["eve", "receptive_keys"].status == exercises.PASSED, rows["eve", "receptive_keys"].message
    assert rows["zoe", "receptive_keys"].code == "answer-in-check-cell"
    assert "Move it into a cell of its own" in rows["zoe", "receptive_keys"].message


def test_student_ids_that_map_to_one_export_name_are_refused_naming_both(tmp_path):
    """h~honest~02 and h_honest_02 map to one Gradescope folder: the 0-point one overwrote the 9-point one."""
    for student in ("h~honest~02", "h_honest_02"):
        notebook_file(tmp_path / "class" / student / "02_kerple_cpd_kernels.ipynb", [])
    with pytest.raises(ValueError, match="'h_honest_02' and 'h~honest~02' map to one export name 'h_honest_02'"):
        grade.grade([tmp_path / "class"], csv_path=tmp_path / "grades.csv")
    assert not (tmp_path / "grades.csv").exists()  # refused before anything ran or was written
    graded = [
        submission(s, "02_kerple_cpd_kernels", [grade.Row("find_shift", p, 2, exercises.PASSED, "passed")])
        for s, p in (("h~honest~02", 2), ("h_honest_02", 0))
    ]
    gradebook.write_csv(graded, tmp_path / "other.csv")
    with pytest.raises(ValueError, match="'h~honest~02' and 'h_honest_02' map to one export name"):
        gradebook.gradebook(tmp_path / "other.csv")


# ------------------------------------------------------------------------ one gradebook per course (issue 47)
# The columns the platforms document for their imports, named here from their sources:
# - Canvas's gradebook CSV: the guide "How do I import grades in the Gradebook?"
#   (https://community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807), a
#   university's summary of it (https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-
#   grades/import-csv-file-carmen-grades: a student is named by Student, ID or SIS User ID, and the file holds SIS
#   Login ID, Section and one column per assignment, a new assignment where Canvas has none of that name), and the
#   file Canvas itself writes (canvas-lms app/models/course.rb, gradebook_to_csv: Student, ID, SIS User ID, SIS Login
#   ID, Section, the assignments, then a second row whose first cell says Points Possible).
# - Moodle's CSV grade import (https://docs.moodle.org/27/en/Grade_import and grade/import/csv/classes/load_data.php):
#   the teacher maps one column ("Map from") to a user field ("Map to": userid, username, useridnumber or useremail)
#   and every other column to a grade item, an existing one or a new one; every row is a user.
MOODLE_USER_FIELDS = {"userid", "username", "useridnumber", "useremail"}
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def test_a_class_of_30_graded_quick_and_06_in_full_makes_one_gradebook(tmp_path):
    """Quick mode grades 02 and 06 (6.5 reported `needs full mode`, no mark), full mode grades 06 again: the
    merged gradebook has every student's points once, 6.5 counted only as graded, and Canvas and Moodle CSVs a
    teacher imports as they are."""
    roster = {n: {e.name: e.points for e in exercises.exercises_of(n)} for n in ("02", "06")}
    stems = {n: EDITIONS[n].stem for n in roster}
    students = [f"s{i:02d}" for i in range(30)]
    earned = lambda i, name, most: most if (i + len(name)) % 3 else 0  # a spread of right and wrong answers

    def batch(number: str, full: bool, i: int):
        rows = []
        for name, most in roster[number].items():
            if name == "best_run" and not full:
                rows.append(grade.Row(name, 0, most, exercises.NEEDS_FULL, "not judged in quick mode", "needs-full"))
            else:
                points = earned(i, name, most)
                rows.append(grade.Row(name, points, most, exercises.PASSED if points else exercises.FAILED, "x"))
        return submission(students[i], stems[number], rows)

    quick = [batch(n, False, i) for i in range(30) for n in ("02", "06")]
    gradebook.write_csv(quick, tmp_path / "quick.csv")
    gradebook.write_written([], gradebook.written_path(tmp_path / "quick.csv"))
    gradebook.gradebook(tmp_path / "quick.csv")
    before = {row["student"]: row for row in rows_of(tmp_path / "quick-totals.csv")}
    most_quick = sum(roster["02"].values()) + sum(roster["06"].values()) - roster["06"]["best_run"]
    assert {row["max_total"] for row in before.values()} == {f"{most_quick:g}"}  # 6.5 not in the maximum yet
    gradebook.write_csv([batch("06", True, i) for i in range(30)], tmp_path / "full06.csv")
    out = tmp_path / "course.csv"
    from minidape import __main__ as cli

    cli.main(["grade", "--merge", str(tmp_path / "quick.csv"), str(tmp_path / "full06.csv"), "--csv", str(out)])
    totals = {row["student"]: row for row in rows_of(tmp_path / "course-totals.csv")}
    most = sum(roster["02"].values()) + sum(roster["06"].values())
    for i, student in enumerate(students):
        want = {n: sum(earned(i, name, p) for name, p in roster[n].items()) for n in roster}
        row = totals[student]
        assert (row[stems["02"]], row[stems["06"]]) == (f"{want['02']:g}", f"{want['06']:g}")
        assert (row["total"], row["max_total"], row["not_judged"]) == (f"{sum(want.values()):g}", f"{most:g}", "0")
    assert len(rows_of(out)) == 30 * (len(roster["02"]) + len(roster["06"]))  # each exercise once
    with open(tmp_path / "course-canvas.csv", newline="") as file:
        canvas = list(csv.reader(file))
    assert canvas[0] == [*CANVAS_HEADER, stems["02"], stems["06"]]
    assert canvas[1][0] == "Points Possible" and canvas[1][5:] == [
        f"{sum(roster['02'].values()):g}",
        f"{sum(roster['06'].values()):g}",
    ]
    assert [row[3] for row in canvas[2:]] == students  # matched by SIS Login ID
    assert [float(row[5]) + float(row[6]) for row in canvas[2:]] == [float(totals[s]["total"]) for s in students]
    with open(tmp_path / "course-moodle.csv", newline="") as file:
        moodle = list(csv.reader(file))
    assert moodle[0] == ["username", stems["02"], stems["06"]] and [row[0] for row in moodle[1:]] == students
    assert moodle[0][0] in MOODLE_USER_FIELDS  # the identifier column, mapped on import; no row but students'
    assert moodle[1][1:] == canvas[2][5:]
