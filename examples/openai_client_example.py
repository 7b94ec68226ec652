"""Ask a running vllm-offload server through the official openai client.

python examples/openai_client_example.py [--base-url http://127.0.0.1:8000/v1]
"""

import argparse
import os

import openai


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("VLLM_API_KEY", "none"))
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=32
    )
    print(reply.choices[0].message.content)
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=32,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
