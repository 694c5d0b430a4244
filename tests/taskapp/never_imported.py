"""Never imported by the tests: the runner must not import it for a job."""

raise AssertionError("tests.taskapp.never_imported was imported")
