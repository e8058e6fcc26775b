"""zoo serve through the official `openai` Python client: chat (whole and streamed, with
usage), completions, models, embeddings (the client asks for base64 and decodes it), and the
client's typed errors for a bad request, an unknown model and a wrong key.

Run against a server started by scripts/openai-client-check.sh (or any `zoo serve`):
    python openai_client_check.py BASE_URL CHAT_MODEL EMBED_BASE_URL EMBED_MODEL KEY
Prints one line per check and exits 1 on the first failure.
"""
import sys

import openai


def main() -> None:
    base, chat_model, embed_base, embed_model, key = sys.argv[1:6]
    client = openai.OpenAI(base_url=base, api_key=key)
    messages = [{"role": "user", "content": "What is the capital of France?"}]

    whole = client.chat.completions.create(
        model=chat_model, messages=messages, max_tokens=16, temperature=0
    )
    text = whole.choices[0].message.content
    assert "Paris" in text, text
    assert whole.usage.completion_tokens > 0 and whole.choices[0].finish_reason in ("stop", "length")
    print("chat:", repr(text))

    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model=chat_model,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text, (pieces, text)
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens, usage
    print("chat stream:", len(pieces), "pieces, usage", usage.total_tokens)

    done = client.completions.create(
        model=chat_model, prompt=["The capital of Germany is", "1, 2, 3,"], max_tokens=5, temperature=0
    )
    assert len(done.choices) == 2 and all(c.text for c in done.choices), done
    print("completions:", [c.text for c in done.choices])

    listed = [m.id for m in client.models.list()]
    assert listed == [chat_model], listed
    print("models:", listed)

    try:
        client.chat.completions.create(model=chat_model, messages=messages, max_tokens=0)
        raise AssertionError("max_tokens 0 was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "max_tokens", e.body
        print("400:", e.body["message"])
    try:
        client.chat.completions.create(model="gpt-4", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        print("404:", e.body["message"])
    try:
        openai.OpenAI(base_url=base, api_key="wrong").models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as e:
        print("401:", e.body["message"])

    embedder = openai.OpenAI(base_url=embed_base, api_key=key)
    out = embedder.embeddings.create(model=embed_model, input=["A cat sits.", "A dog runs."])
    floats = embedder.embeddings.create(
        model=embed_model, input=["A cat sits.", "A dog runs."], encoding_format="float"
    )
    assert len(out.data) == 2 and len(out.data[0].embedding) == len(floats.data[0].embedding)
    diff = max(abs(a - b) for a, b in zip(out.data[0].embedding, floats.data[0].embedding))
    assert diff == 0.0, diff
    print("embeddings:", len(out.data[0].embedding), "dims, base64 == float, usage", out.usage.total_tokens)
    print("openai client: all checks passed")


if __name__ == "__main__":
    main()
