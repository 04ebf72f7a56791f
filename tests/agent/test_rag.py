"""RAG over documents the tests make themselves: Markdown, CSV, a PDF with a table, a PNG with text."""

import json

import pytest

from ponder.agent import Agent, AgentConfig, BackendPolicy
from ponder.agent.rag import RagIndex, provenance
from ponder.agent.rag_ingest import OCR_MISSING, chunk_text, ingest, ocr_available, row_passage
from ponder.rollout.scripted import ScriptedBackend
from ponder.tools.retrieval import load_encoder

from .conftest import call

needs_ocr = pytest.mark.skipif(not ocr_available(), reason=OCR_MISSING)


def make_pdf(path):
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 8, "Quarterly report. The Zephyr turbine program was delayed by heavy storms in the northern region.")
    pdf.add_page()
    pdf.multi_cell(0, 8, "Parts price list follows.")
    with pdf.table() as table:
        for row in [("Part", "Price", "Supplier"), ("Widget", "12.50", "Acme"), ("Gizmo", "99.00", "Globex")]:
            cells = table.row()
            for cell in row:
                cells.cell(cell)
    pdf.output(str(path))


def make_png(path, text):
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (900, 160), "white")
    ImageDraw.Draw(image).text((20, 50), text, fill="black", font=ImageFont.load_default(size=40))
    image.save(path)


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    (root / "guide.md").write_text("# Setup\nInstall the pump first.\n\n# Maintenance\nOil the bearings every 90 days.\n")
    (root / "staff.csv").write_text("name,role,office\nMira Okafor,hydrologist,Lagos\nTeo Brandt,welder,Kiel\n")
    make_pdf(root / "report.pdf")
    (root / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "data.bin").write_bytes(b"\x00\x01")
    (root / "empty.txt").write_text("   \n")
    return root


@pytest.fixture(scope="module")
def index(docs):
    return RagIndex.from_paths([docs], encoder=load_encoder())


def test_chunks_cover_the_text_with_bounded_overlap():
    text = " ".join(f"word{i}" for i in range(300))
    spans = chunk_text(text, 100, 30)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        assert e1 - s1 <= 100 and 0 < e1 - s2 <= 30 and text[s2 - 1] == " "
    assert chunk_text(text, 100, 0)[1][0] == spans[0][1]
    with pytest.raises(ValueError, match="overlap"):
        chunk_text(text, 10, 10)


def test_ingest_keeps_provenance_and_reports_bad_files(index, docs):
    by_id = {d.id: d for d in index.documents}
    assert by_id["staff.csv#r2"].contents == "name: Teo Brandt; role: welder; office: Kiel"
    assert by_id["staff.csv#r2"].metadata["row"] == 2
    assert by_id["report.pdf#p2-t0-r1"].contents == "Part: Widget; Price: 12.50; Supplier: Acme"
    assert by_id["report.pdf#p2-t0-r1"].metadata["page"] == 2
    assert "Zephyr turbine" in by_id["report.pdf#p1-c0"].contents
    assert "Widget" not in by_id["report.pdf#p2-c0"].contents  # table text is not repeated as prose
    assert by_id["guide.md#c0"].metadata["section"] == "Setup"
    errors = dict((path.split("/")[-1], message) for path, message in index.report.errors)
    assert errors["broken.pdf"].startswith("cannot parse PDF")
    assert errors["latin1.txt"] == "not UTF-8 text (byte 3)"
    assert errors["data.bin"].startswith("unsupported file type '.bin'")
    assert errors["empty.txt"] == "no text found"


def test_hybrid_search_finds_table_rows_and_prose_with_provenance(index):
    price = index.search("How much does a Gizmo cost?", k=1)[0]
    assert (price.source, price.page, price.row, price.table) == ("report.pdf", 2, 2, 0)
    assert price.snippet == "Part: Gizmo; Price: 99.00; Supplier: Globex"
    storm = index.search("Why was the turbine project late?", k=1)[0]
    assert (storm.source, storm.page) == ("report.pdf", 1) and "storms" in storm.snippet
    person = index.search("Who works as a welder?", k=1)[0]
    assert (person.source, person.row) == ("staff.csv", 2)


def test_agent_answer_carries_provenance(index, tokenizer):
    scripts = {"t1": [call("rag_search", query="bearings oil interval"), "Every 90 days [guide.md]."]}
    agent = Agent(BackendPolicy(ScriptedBackend(tokenizer, scripts)), [index.as_tool(k=2)], AgentConfig())
    state = agent.run("How often are the bearings oiled?", key="t1")
    assert state.answer == "Every 90 days [guide.md]."
    shown = json.loads(state.turns[0].tool_results[0].content)["results"]
    assert shown[0]["source"] == "guide.md" and shown[0]["section"] == "Maintenance"
    cited = provenance(state)
    assert cited == shown and "Oil the bearings every 90 days." in cited[0]["snippet"]


def test_nothing_readable_is_one_line(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="no passages to index .*unsupported file type"):
        RagIndex.from_paths([tmp_path], kind="bm25")
    assert ingest([tmp_path / "missing"]).errors == [(str(tmp_path / "missing"), "no such file or folder")]


def test_row_passage_names_unnamed_columns():
    assert row_passage(["a", ""], [1, None]) == "a: 1; column 2: "


@needs_ocr
def test_png_text_is_read_by_ocr(tmp_path):
    make_png(tmp_path / "note.png", "The harbor code is BLUE HERON")
    report = ingest([tmp_path])
    assert report.errors == []
    [passage] = report.documents
    assert "BLUE HERON" in passage.contents and passage.metadata["ocr"] is True
    index = RagIndex(report.documents, kind="bm25")
    assert index.search("harbor code", k=1)[0].source == "note.png"


def test_without_tesseract_images_are_skipped_with_the_install_hint(tmp_path, monkeypatch):
    make_png(tmp_path / "note.png", "hello")
    monkeypatch.setattr("ponder.agent.rag_ingest.shutil.which", lambda name: None)
    report = ingest([tmp_path])
    assert report.documents == [] and report.errors == [(str(tmp_path / "note.png"), OCR_MISSING)]
