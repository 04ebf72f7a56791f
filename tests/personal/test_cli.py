"""`ponder personal list | update | rollback` in process (tiny model): the table, an
update that makes a new version current, a rollback, bad input as one line with exit 2."""

from __future__ import annotations

from ponder.cli import main
from ponder.personal.store import AdapterStore

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_list_update_and_rollback(tmp_path, capsys, adapter_dirs, tiny_hash):
    store = AdapterStore(tmp_path)
    store.save_version("alice", adapter_dirs["one"], tiny_hash)
    chat = store.log_interaction("alice", QUESTION, "Lyon.")
    store.add_feedback(chat, "rewrite", text="Paris.")
    store.add_feedback(chat, "down")
    store.log_interaction("bob", QUESTION, "Nice.")

    assert main(["personal", "list", "--users", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["user", "current", "versions", "chats", "up", "down", "rewrite", "correct", "outcome"]
    assert [line.split() for line in lines[1:]] == [["alice", "1", "1", "1", "0", "1", "1", "0", "0"],
                                                    ["bob", "-", "0", "1", "0", "0", "0", "0", "0"]]  # fmt: skip

    code = main(["personal", "update", "--users", str(tmp_path), "--user", "alice", "--model", "tiny", "--steps", "2",
                 "--lr", "0.01", "--device", "cpu"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("user alice: v2 is current (1 pairs from 2 feedback rows, DPO margin ")
    assert store.current("alice").parent_version == 1 and store.current("alice").steps == 2

    assert main(["personal", "rollback", "--users", str(tmp_path), "--user", "alice", "--version", "1"]) == 0
    assert capsys.readouterr().out == "user alice: v1 is current\n" and store.current("alice").version == 1


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, adapter_dirs, tiny_hash):
    assert main(["personal", "list", "--users", str(tmp_path / "none")]) == 2
    assert "no adapter store there" in capsys.readouterr().err and not (tmp_path / "none").exists()
    AdapterStore(tmp_path).save_version("alice", adapter_dirs["one"], tiny_hash)
    assert main(["personal", "rollback", "--users", str(tmp_path), "--user", "alice", "--version", "4"]) == 2
    assert capsys.readouterr().err == ("ponder personal: error: user alice has no adapter version 4 "
                                       "(versions: 1)\n")  # fmt: skip
    assert main(["personal", "rollback", "--users", str(tmp_path), "--user", "../x", "--version", "1"]) == 2
    assert "use 1-64 letters" in capsys.readouterr().err
    assert main(["personal", "update", "--users", str(tmp_path), "--user", "alice", "--model", "tiny"]) == 2
    assert "user alice: 0 preference pair(s) from 0 feedback row(s)" in capsys.readouterr().err
