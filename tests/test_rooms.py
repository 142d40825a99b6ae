"""train/ in rooms by concern (issues 40, 53): its top level holds only the entrypoint, the loop and the model it
trains; the launcher's contract, the jobs and every other module live in a room, so a newcomer finds a concept by
its folder."""
from tests.support import ROOT

TOP = {"__init__", "__main__", "loop", "model", "optim"}
ROOMS = {"contract", "parallel", "federation", "data", "runtime", "measure", "job"}


def test_train_top_level_holds_only_the_entrypoint_the_loop_and_the_model():
    train = ROOT / "train"
    assert {p.stem for p in train.glob("*.py")} == TOP
    assert {p.name for p in train.iterdir() if p.is_dir() and p.name != "__pycache__"} == ROOMS
    for room in ROOMS:
        assert (train / room / "__init__.py").read_text().startswith('"""'), room  # says what the room holds
        assert {p.name for p in (train / room).iterdir() if p.is_dir()} <= {"__pycache__"}, room  # one level


def test_shared_helpers_have_one_home():
    """Atomic writes and the user-facing errors are defined once, in train/contract/common.py, and imported from
    there."""
    defined = {}
    for path in [*(ROOT / "train").rglob("*.py"), *(ROOT / "launcher").rglob("*.py")]:
        for line in path.read_text().splitlines():
            for name in ("def write_atomic(", "def atomic(", "class FedshardError("):
                if line.startswith(name):
                    defined.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert defined == {name: ["train/contract/common.py"] for name in ("def write_atomic(", "def atomic(",
                                                              "class FedshardError(")}
