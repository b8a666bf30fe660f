"""The model server's script format, as text: one source for the docs and the CLI help.

A module of its own with no imports, so ``flower-super`` can show it in
``flower-super model-server --help`` without loading the server. Every key the parser in
:mod:`._script` accepts is listed under a ``... keys:`` heading, two spaces in;
``tests/test_script_format.py`` holds the two to each other. Lines stay within 76
columns: Click prints them verbatim, indented by two, in an 80-column help.
"""

SCRIPT_FORMAT = """\
Script format (a dict, or a JSON file holding one)::

    {
      "conversations": [
        {"name": "build",
         "match": {"marker": "[[build]]"},
         "turns": [
           {"tool_use": [{"name": "Bash", "input": {"command": "ls"}}]},
           {"text": "Listed.", "delay": 30, "times": 1},
           {"error": 529, "times": 2, "text": "Recovered."},
           {"text": "Big context.", "usage": {"input_tokens": 150000}},
           {"cut": 3, "times": 1, "text": "After the cut."},
           {"outage": 5, "times": 1, "text": "Back again."}
         ]}
      ],
      "default": ["ok"]
    }

Conversations: a request is answered by the first conversation whose
"match" holds, else by "default"; with neither, by a text saying so
(logged as "unmatched"). Every key a script may hold is listed below;
any other key is an error when the script is loaded (ConfigError).

Top-level keys:
  conversations  list of conversations, tried in order
  default        the turns for a request no conversation matches: a
                 list of turns, or {"name": ..., "turns": [...]}

Conversation keys:
  name         a unique label, shown in the request log (default
               "conversation-<index>")
  match        what a request must carry (keys below); required
  turns        the answers, a list of 1..9999 turns
  one_session  true: the conversation answers one session only, the
               first whose request it matches; other sessions (and a
               request naming none) pass it by to the next that
               matches. Several alike, one per fresh session, script
               "the Nth session asked this" (a judge's rounds). Which
               session took it is the server's memory: set_script()
               and a restart forget it

Match keys (one or more; every one given must hold; non-empty strings):
  marker   a substring of some user text block (the prompt is one;
           tool results are not)
  prompt   some user text block is exactly this (surrounding
           whitespace aside)
  system   a substring of the system prompt
  session  the session id the CLI sends in metadata.user_id
  result   a substring of some tool result the request carries (a
           judge that reads a file can be answered by what it holds)

Which turn answers is read from the request itself: one past the last
turn of its conversation found in the request's assistant history. Our
tool_use ids carry their turn (toolu_01FLWR<turn:4><block:2>...) and
text turns are recognised by their text (keep texts distinct within a
conversation), so the choice survives CLI kills, resumes and restarts
of the server alike, with no counter. Past the last turn the server
answers a text naming the problem (logged as "exhausted").

Turn keys (a plain string is short for {"text": ...}):
  text         the assistant's text
  tool_use     one {"name": ..., "input": {...}} or a list of up to 99;
               the CLI runs the tools and sends their results next
  usage        token counts to report (keys below); the others are
               estimated from the sizes (about 4 bytes a token)
  stop_reason  sent as given; default "tool_use" when the turn has
               tool_use, else "end_turn"
  delay        seconds to hold the request before answering (a test can
               kill the CLI meanwhile; stopping the server drops it)
  error        answer an HTTP error instead of the content (forms below)
  cut          stream that many SSE events, then reset the connection
               (a non-streaming answer: half its body, then the reset)
  outage       reset the connection and refuse connections for that
               many seconds, then listen on the same port again
  times        fire the fault and the delay for the first N requests
               that reach this turn only (counted by the server, per
               conversation and turn); without it they fire every time

At most one fault (error, cut or outage) per turn. A turn needs text or
tool_use, what it answers once its fault is spent; only a permanent
fault (no times) may go without. delay and outage are seconds (>= 0),
cut and times whole numbers (times >= 1).

Usage keys (non-negative integers):
  input_tokens
  output_tokens
  cache_read_input_tokens
  cache_creation_input_tokens

An error is a status 400..599 (529), a preset name ("overloaded"), or an
object {"status": 429, "retry_after": 2}, in the real API's JSON shape.

Error presets (name, status, type):
  overloaded       529 overloaded_error
  rate_limit       429 rate_limit_error
  api_error        500 api_error
  authentication   401 authentication_error
  permission       403 permission_error
  invalid_request  400 invalid_request_error
  prompt_too_long  400 invalid_request_error "prompt is too long: ..."

Error keys (of an error given as an object):
  status       the HTTP status, 400..599 (required)
  message      the error message (default: the real API's for the status)
  type         the error type (default: the real API's for the status)
  retry_after  seconds, sent as the retry-after header

Beyond the script, like the real API, the server rejects (400
invalid_request_error, logged as "rejected") a request whose tool_use
ids have no tool_result in the next message, or whose tool_result names
no tool_use of the previous message. It answers count_tokens,
/v1/models and HEAD too; anything else gets a 404 in the API's shape.

The CLI compacts on its own when the reported context nears the window
(measured: at about 98% of the 1M window of its default model) and
after a "prompt is too long" in a multi-turn session: it then sends a
summary request whose last user text starts with "CRITICAL: Respond
with TEXT ONLY". Route those with a conversation matching that marker,
listed first. A flower Runtime with handoff on (the default) turns the
CLI's auto-compaction off, so its steps never send those.
"""
