/**
 * @file mmoe_chat.h
 * @brief DeepSeek-V4 chat encoding: OpenAI-style messages -> the prompt text the model was trained on.
 *
 * DeepSeek-V4 has no Jinja template; its `encoding_dsv4.py` writes a conversation
 * as one string with special marker strings (@ref spec_arch_chat):
 *
 * @verbatim
 *     <｜begin▁of▁sentence｜>SYSTEM<｜User｜>QUESTION<｜Assistant｜></think>ANSWER<｜end▁of▁sentence｜><｜User｜>...
 * @endverbatim
 *
 * A prompt for generation ends with `<｜Assistant｜></think>` (chat mode) or
 * `<｜Assistant｜><think>` (thinking mode).  Tool messages are merged into user turns
 * as `<tool_result>...</tool_result>` blocks, tool schemas and tool calls are written
 * in the DSML format, and in thinking mode with drop_thinking the reasoning of earlier
 * turns is dropped.  Tokenizing the text is a separate step (mmoe_tokenizer_encode):
 * every marker is an added token of the DeepSeek-V4 tokenizer.
 */
#ifndef MMOE_CHAT_H
#define MMOE_CHAT_H

#include <stddef.h>

#include "mmoe_error.h"
#include "mmoe_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Chat (answer directly) or thinking (the model reasons inside `<think>` ... `</think>` first). */
typedef enum mmoe_chat_mode {
    MMOE_CHAT_MODE_CHAT = 0,    /**< chat mode: the prompt ends with `</think>` */
    MMOE_CHAT_MODE_THINKING = 1 /**< thinking mode: the prompt ends with `<think>` */
} mmoe_chat_mode;

/** Reasoning effort; only MAX changes the text (a preamble before the first message, thinking mode). */
typedef enum mmoe_chat_effort {
    MMOE_CHAT_EFFORT_NONE = 0, /**< no preamble */
    MMOE_CHAT_EFFORT_HIGH = 1, /**< no preamble either (the reference treats it like none) */
    MMOE_CHAT_EFFORT_MAX = 2   /**< the maximum-effort preamble before message 0 (thinking mode) */
} mmoe_chat_effort;

/** Options of the chat encoder (see mmoe_chat_options_default()). */
typedef struct mmoe_chat_options {
    mmoe_chat_mode mode;     /**< chat or thinking */
    int drop_thinking;       /**< drop the reasoning of earlier turns (default 1; forced off when tools are present) */
    int add_bos;             /**< start with BOS when there is no context (default 1) */
    mmoe_chat_effort effort; /**< reasoning effort (default NONE) */
    size_t n_context;        /**< the first n_context messages are context (already in the KV cache): not rendered */
} mmoe_chat_options;

/** Fill @p o with the defaults: chat mode, drop_thinking on, BOS on, no effort preamble, no context. */
void mmoe_chat_options_default(mmoe_chat_options *o);

/**
 * Render a conversation to prompt text, appending to @p prompt.
 * @param json  the conversation as JSON text: an array of messages
 *              (`{"role": "system"|"user"|"assistant"|"tool"|"developer"|"latest_reminder", "content": ...,
 *              "reasoning_content", "tool_calls", "tool_call_id", "tools", "response_format", "task",
 *              "wo_eos"}`), or an object `{"messages": [...], "tools": [...]}` whose tools are
 *              attached to the first message, which must then be a system message
 * @param len   length of @p json in bytes
 * @param opt   options (NULL: defaults)
 * @param prompt  the prompt text is appended here (unchanged on error)
 * @param err     message on failure
 * @return MMOE_OK; MMOE_EFORMAT for invalid JSON or a malformed message (the message names
 *         the message index and key); MMOE_EINVAL for an unknown role or task
 */
mmoe_status mmoe_chat_encode_json(const char *json, size_t len, const mmoe_chat_options *opt, mmoe_text *prompt,
                                  mmoe_error *err);

/**
 * Parse a generated completion (the text after the prompt, ending with EOS) back into an
 * assistant message (@ref spec_arch_chat_parse), appended to @p message as JSON text:
 * `{"role": "assistant", "content": ..., "reasoning_content": ..., "tool_calls": [...]}`
 * with the tool calls in OpenAI form (`{"type": "function", "function": {"name", "arguments"}}`,
 * arguments a JSON object string).  The message can be appended to the conversation for
 * the next turn.
 * @param text     the completion (UTF-8)
 * @param len      its length in bytes
 * @param mode     the mode of the prompt: in thinking mode the completion starts with the reasoning
 * @param message  the message JSON is appended here
 * @param err      message on failure
 * @return MMOE_OK, or MMOE_EFORMAT naming the byte offset and what was expected
 */
mmoe_status mmoe_chat_parse_completion(const char *text, size_t len, mmoe_chat_mode mode, mmoe_text *message,
                                       mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_CHAT_H */
