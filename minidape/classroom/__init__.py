"""The classroom: the notebooks' exercises and their checks (`exercises`, one module per notebook), the notebooks'
set-up helper (`notebook`), and the teacher's side — the teacher's edition read by the grader (`edition`,
`collect`), the grader (`grade`) and its sandbox (`sandbox`), the gradebook (`gradebook`) and the hand-out
(`handout`).

It imports the core, the helpers and the lab (the checks train and score models), never the study.
`from minidape import exercises, notebook` and `md.grade` reach it from the package's top.
"""
