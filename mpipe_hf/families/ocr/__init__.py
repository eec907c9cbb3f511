"""Document OCR models with a SAM-style vision tower: the image's SAM patches downsampled by two stride-2
convolutions into the queries a language model reads. GOT-OCR2 (``got_ocr2``) and PP-Chart2Table (``pp_chart2table``,
GOT-OCR2's model class under its own config) over a Qwen2 text model; Unlimited-OCR (``unlimited_ocr``), DeepSeek-
OCR-2's layout (a SAM tower and an encoder over its features, global views and local tiles) with a newline after each
row of queries and a DeepSeek-V2-style text model with reference sliding-window layers."""
