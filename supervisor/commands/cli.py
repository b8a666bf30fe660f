"""``flower-super``: start a flow under a supervisor, look at a run_dir, try it offline.

Every mistake a person can make ends in one line and a hint (exit status 2), never a
traceback. Every text it prints is in the person's language: its own help through the
catalogue, and click's own words (``Usage:``, ``Error: No such option …``) through click's
gettext hook, answered from the catalogue (:func:`flower.i18n.gettext_for`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import click.core
import click.decorators
import click.exceptions
import click.formatting
import click.parser
import click.types

from flower import FlowerError, __version__
from flower.i18n import define, gettext_for, t
from supervisor.commands.leaving import ended
from supervisor.inspect.runstate import (
    START_WAIT_S,
    choose,
    looking,
    open_chosen,
    resume_line,
    starting,
    warn,
)
from supervisor.run.secrets import warn_if_password_in_argv

# click's own words (its gettext message ids) that a person of flower-super can meet.
CLICK_WORDS = {
    "Usage:": "用法:",
    "Options": "选项",
    "Commands": "子命令",
    "Positional arguments": "参数",
    "Show this message and exit.": "显示这段帮助然后退出。",
    "Show the version and exit.": "显示版本然后退出。",
    "default: {default}": "默认:{default}",
    "Error: {message}": "错误:{message}",
    "Try '{command} {option}' for help.": "用 '{command} {option}' 看帮助。",
    "No such option {name!r}.": "没有 {name!r} 这个选项。",
    "No such command {name!r}.": "没有 {name!r} 这个子命令。",
    "Did you mean {possibility}?": "是不是想写 {possibility}?",
    "(Did you mean one of: {possibilities}?)": "(是不是想写其中一个:{possibilities}?)",
    "Missing argument": "缺了参数",
    "Missing option": "缺了选项",
    "Missing parameter": "缺了参数",
    "Missing command.": "缺了子命令。",
    "Option {name!r} requires an argument.": "选项 {name!r} 后面要跟一个值。",
    "Option {name!r} requires {nargs} arguments.": "选项 {name!r} 后面要跟 {nargs} 个值。",
    "Option {name!r} does not take a value.": "选项 {name!r} 不带值。",
    "Got unexpected extra argument ({args})": "多出来一个参数({args})",
    "Got unexpected extra arguments ({args})": "多出来几个参数({args})",
    "Invalid value for {param_hint}: {message}": "{param_hint} 的值不对:{message}",
    "Invalid value: {message}": "值不对:{message}",
    "{value!r} is not a valid {number_type}.": "{value!r} 不是合法的 {number_type}。",
    "{name} {filename!r} does not exist.": "{name} {filename!r} 不存在。",
    "{name} {filename!r} is a file.": "{name} {filename!r} 是文件。",
    "{name} {filename!r} is a directory.": "{name} {filename!r} 是目录。",
    "file": "文件",
    "directory": "目录",
    "path": "路径",
    "Aborted!": "已中止!",
}
define({f"click:{en}": (zh, en) for en, zh in CLICK_WORDS.items()})
_gettext, _ngettext = gettext_for("click:")
for _module in (
    click.core,
    click.decorators,
    click.exceptions,
    click.formatting,
    click.parser,
    click.types,
):  # each looks its `_` and `ngettext` up as module globals, at the moment it words a text
    if hasattr(_module, "_"):
        _module._ = _gettext  # type: ignore[attr-defined]
    if hasattr(_module, "ngettext"):
        _module.ngettext = _ngettext  # type: ignore[attr-defined]

define(
    {
        "cli.hint": ("  提示:{hint}", "  hint: {hint}"),
        "cli.run_dir_file": ("运行目录 {path} 是个文件", "run directory {path} is a file"),
        "cli.run_dir_under_file": (
            "运行目录 {path} 在文件 {level} 底下",
            "run directory {path} lies under {level}, which is a file",
        ),
        "cli.run_dir.hint": (
            "-r 给一个目录(没有会建),例如 -r runs",
            "pass -r with a directory (it is created if missing), e.g. -r runs",
        ),
        "cli.not_dir": ("工作区 {ws} 不是目录", "workspace {ws} is not a directory"),
        "cli.verified": (
            "流程 '{flow}' 没问题:{n} 个步骤",
            "flow '{flow}' is valid: {n} {n|step|steps}",
        ),
        "cli.not_dir.hint": (
            "-w 给一个目录(没有会建)",
            "pass -w with a directory (it is created if missing)",
        ),
        "cli.ws_failed": ("建不了工作区 {ws}:{error}", "cannot create workspace {ws}: {error}"),
        # flower-super's help, command by command (click prints \b paragraphs as written)
        "super.help": (
            "flower-super:跑 flower 的流程,每个步骤一个受监管的子进程。\n\n"
            "在同一个目录再跑一次,它就接着同一段对话:不管上次是跑完了、被 Ctrl-C、"
            "收到 SIGTERM/SIGHUP、被 kill -9,还是机器重启了。",
            "flower-super: run flower workflows with one supervised child process per step.\n\n"
            "Run it again in the same directory and it carries on the same conversation, "
            "whether the last run finished, was Ctrl-C'd, got SIGTERM/SIGHUP, was kill -9'd "
            "or the machine rebooted.",
        ),
        "super.help.run_dir": (
            "放 lineage.json、manifest.json、sessions.db 的运行目录(默认 ./runs,相对当前目录)",
            "run directory holding lineage.json, manifest.json, sessions.db (default ./runs, "
            "relative to the current directory)",
        ),
        "super.help.flow": (
            "要跑的你自己的 Workflow(默认:起步流程 确认需求 → 设定目标 → 干活);"
            'ASK 以 ctx["_ask"] 交给它,或作为可调用 ATTR 的参数',
            "your own Workflow to run (default: the starter flow 确认需求 → 设定目标 → 干活); "
            'ASK reaches it as ctx["_ask"], or as the argument of a callable ATTR',
        ),
        "super.help.workspace": (
            "agent 干活的目录(默认当前目录;没有就建)",
            "the directory the agents work in (default: the current directory; created if missing)",
        ),
        "super.help.workspace_of": (
            "工作区(默认当前目录);用状态地址时靠它认出是哪个工作区的运行",
            "the workspace (default: the current directory); with a state URL it tells "
            "whose runs these are",
        ),
        "super.help.state": (
            "运行状态本身:把本地的运行状态搬进 PostgreSQL。",
            "The run state itself: move a workspace's local run state into PostgreSQL.",
        ),
        "super.help.export_to": (
            "目标数据库的 postgresql:// 地址",
            "the postgresql:// URL of the database to copy into",
        ),
        "super.help.export": (
            "把运行目录里的运行状态复制进 PostgreSQL:会话(每条记录原样、按顺序,子代理的也在)、"
            "工具账本、血缘(唤醒次数和步骤)、清单、运行记录、跨运行缓存、事件日志。\n\n"
            "在工作区里运行(或用 -w、-r 指定)。本地文件原样不动;工作区的身份写进 "
            ".flower/workspace-id,沿用原来按路径算出的键,所以复制过去的会话还认得出。"
            "重复运行不会重复复制:第二次什么都不变。之后在这个工作区里用 --state URL"
            "(或 FLOWER_STATE)运行,就在同一段对话上接着做,唤醒次数接着数。"
            "有 flower 正在这个运行目录里跑时拒绝复制。",
            "Copy the run state of a run directory into PostgreSQL: sessions (every entry as "
            "it is, in order, subagents' too), the tool ledger, lineage (its wake count and "
            "steps), the manifest, the run records, the cross-run cache and the event logs."
            "\n\nRun it in the workspace (or name it with -w, and the run directory with -r). "
            "The local files are left as they are; the workspace's identity is written to "
            ".flower/workspace-id, keeping the key its path gave it, so the copied sessions "
            "are found. Running it again copies nothing twice: the second time changes "
            "nothing. Afterwards `--state URL` (or FLOWER_STATE) in that workspace carries on "
            "the same conversations, and the wake count goes on. Refused while a flower runs "
            "in the run directory.",
        ),
        "super.help.new": (
            "不接着上次:把 lineage.json、需求.md、目标.md 归档,重开一件事",
            "do not continue last time: archive lineage.json, 需求.md, 目标.md and start a new "
            "thing",
        ),
        "super.help.no_trim": (
            "续跑时不裁剪旧的大工具结果(这里默认裁剪)",
            "do not trim large old tool results when resuming (trimming is on by default here)",
        ),
        "super.help.rounds": (
            "起步流程:干活的总轮数(每轮由新会话里的判定者判一次);0 和 1 都是一轮",
            "starter flow: work rounds in all (each judged in a fresh session); 0 and 1 mean one",
        ),
        "super.help.timeout": (
            "起步流程:提问等你多少秒;0(或负数)= 全自动,提问立刻落空,由它自己判断",
            "starter flow: how long a question waits for you; 0 (or less) = unattended, every "
            "question falls through at once and the agent decides",
        ),
        "super.help.no_goal": (
            "起步流程:不写 目标.md、不判定;干活步骤做完就结束",
            "starter flow: no 目标.md and no judge; the run is done when the work step is",
        ),
        "super.help.start": (
            "开始(或接着)跑一个流程。ASK 是要做的事;不给 = 接着做。\n\n"
            "不给 --flow 时跑起步流程:确认需求(问到需求清楚,冻结为 .flower/notes/需求.md)、"
            "设定目标(目标和判定清单,.flower/notes/目标.md)、干活(协调者带一个 coder),"
            "每轮之后由新会话里的判定者判一次。再跑一次并说一句话,它会追加进 需求.md,"
            "目标重新推导,干活在同一个会话里接着做;什么都不说就直接接着做。\n\n"
            "\b\n例子:\n"
            '  flower-super start "写个 markdown 转 html 的脚本"\n'
            '  flower-super start "顺便高亮代码块"       # 同一段对话,再说一句\n'
            "  flower-super start                         # 从停下的地方接着做\n"
            "  flower-super start --flow flows/review.py:flow -r runs\n\n"
            "\b\n跑的时候:\n"
            "  按一次 Ctrl-C  打断这一步;说一句话(或直接回车)它就接着做\n"
            "  按两次 Ctrl-C  退出;以后再跑同一条命令就接着做\n"
            "  SIGTERM/HUP    在跑的步骤记为 killed-by-signal;再启动就接上\n"
            "  失败           API 出错或步骤子进程死掉算一次失败的尝试:退避后接着同一个会话,\n"
            "                 最多 6 次;bug 或写错的 spec 立刻停下这一步\n"
            "                 (traceback 在 runs/logs/<run>/<step>.log)\n\n"
            "退出码:0 完成;1 有步骤让运行停下(那一行 \"在步骤 '<step>' 中止:<why>\");"
            "2 用错了(一行说明加提示);130 连按两次 Ctrl-C 之后。",
            "Start (or carry on) a flow. ASK is what you want done; nothing = carry on.\n\n"
            "Without --flow it runs the starter flow: 确认需求 (asks until the requirement is "
            "clear, frozen as .flower/notes/需求.md), 设定目标 (a goal with a checklist, "
            ".flower/notes/目标.md), 干活 (a coordinator with a coder), judged after every "
            "round by a judge in a new session. Run again with a sentence and it is added to "
            "需求.md, the goal is derived again and the work carries on in the same session; "
            "run again with nothing and it simply carries on.\n\n"
            "\b\nExamples:\n"
            '  flower-super start "write a markdown to html script"\n'
            '  flower-super start "also highlight code blocks"   # same conversation, one more '
            "sentence\n"
            "  flower-super start                                 # carry on where it stopped\n"
            "  flower-super start --flow flows/review.py:flow -r runs\n\n"
            "\b\nWhile it runs:\n"
            "  Ctrl-C once   interrupt the step; type a sentence (or just Enter) and it carries "
            "on\n"
            "  Ctrl-C twice  exit; run the same command again later to continue\n"
            "  SIGTERM/HUP   the step in flight is recorded as killed-by-signal; a restart "
            "resumes\n"
            "  failures      an API error or a step child that died is one failed attempt: "
            "the same\n"
            "                session is resumed after a backoff, up to 6 attempts in all; a "
            "bug or a\n"
            "                bad spec stops the step at once (traceback in "
            "runs/logs/<run>/<step>.log)\n\n"
            'Exit status: 0 finished; 1 a step stopped the run (the line "stopped at step '
            "'<step>': <why>\"); 2 a mistake (one line with a hint); 130 after Ctrl-C twice.",
        ),
        "super.help.json": (
            "打印一个 JSON 对象,不打印文字",
            "print one JSON object instead of text",
        ),
        "super.help.ui": (
            "在浏览器里看运行:每次运行、它的时间线(每次尝试一条,杀掉、醒来、接手都标出来)、"
            "每一步的对话,实时更新;也能从页面取消运行、回答它在等的问题。默认只在本机"
            "(127.0.0.1)提供;打印的地址带着令牌,看对话、取消和回答都要它。",
            "See runs in a browser: every run, its timeline (one bar per attempt, with kills, "
            "wakes and takeovers marked), each step's conversation, updated live; cancel a run "
            "or answer the question it waits on from the page. Served on this machine only "
            "(127.0.0.1) unless --host says otherwise; the address it prints carries a token "
            "that conversations and actions need (and, on another --host, every request).",
        ),
        "super.help.ui_host": (
            "在哪个地址上提供(默认只本机;别的地址上每个请求都要令牌)",
            "the address to serve on (default: this machine only; on any other address every "
            "request needs the token)",
        ),
        "super.help.ui_port": ("端口(0:随便挑一个空闲的)", "the port (0: any free one)"),
        "super.help.status": (
            "在 RUN_DIR 里跑过的每个 flower(用状态地址时:工作区 -w 的每个 flower):"
            "在跑还是已停、状态、步骤、会话、最后几行清单。\n\n"
            "退出码:0 没有已停又没做完的;3 有(它下面列出接着做的命令);"
            "2 那里没有运行目录,或它是个文件,或状态地址用不了(一行说明加提示)。",
            "Every flower that ran in RUN_DIR (with a state URL: every flower of the workspace "
            "-w): live or dead, state, step, session, last rows."
            "\n\nExit status: 0 when nothing is dead-and-unfinished; 3 otherwise (the command "
            "that carries it on is shown under it); 2 when there is no run directory there, or "
            "it is a file, or the state URL cannot be used (one line with a hint).",
        ),
        "super.help.cancel": (
            "像 SIGTERM 那样停下在跑的 flower RUN(status 列出的 run id,或能唯一确定的前缀)。"
            "\n\n它在跑的步骤得到一行 killed-by-signal,子进程停下;运行仍可接着做:在同一个"
            "地方再跑 `flower-super start` 就接上。没在跑或不认识的 RUN 是一行说明,退出码 2。",
            "Stop the live flower RUN (a run id from `status`, or a unique prefix) as SIGTERM "
            "does.\n\nIts step in flight gets one killed-by-signal row and its children stop; "
            "the run stays resumable: `flower-super start` in the same place carries on. A run "
            "that is not live, or unknown, is one line and exit status 2.",
        ),
        "super.help.verify_flow": ("要检查的 Workflow", "the Workflow to check"),
        "super.help.verify": (
            "只检查流程、不跑:没问题退出码 0,否则退出码 2,每处问题一行,写明步骤和规则"
            "(判定过的、要和人说话的或 idempotent=False 的步骤用了 cross-run;不认识的指纹前缀;"
            "写错的 ttl)。`start --flow` 在任何模型调用之前同样拒绝不合法的流程。",
            "Check a flow without running it: exit 0 when it is valid, else exit 2 with one "
            "line per problem naming the step and the rule (cross-run on a judged, "
            "human-facing or idempotent=False step; an unknown fingerprint prefix; a bad ttl). "
            "`start --flow` refuses an invalid flow the same way before any model call.",
        ),
        "super.help.show_json": (
            "打印一个 JSON 文档,不打印文字",
            "print one JSON document instead of text",
        ),
        "super.help.show": (
            "从 sessions.db 打印一个步骤的对话:提示、模型的话、每次工具调用一行、结果折叠。\n\n"
            "\b\n不给:最近一次运行的最后一个步骤(在跑的话就是正在跑的那个)。\n"
            "RUN:那次运行的每段对话,按跑的顺序(status 列出的 run id,或能唯一确定的前缀)。\n"
            "STEP:那个步骤的会话(步骤名,或清单里的标签,如 干活#round2)。\n\n"
            "它只读 sessions.db,flower 在跑时也能用。不认识的运行或步骤是一行说明,退出码 2。",
            "Print a step's conversation from sessions.db: prompts, the model's text, each tool "
            "call on one line, each result folded.\n\n"
            "\b\nNothing: the latest step of the latest run (the one in flight, if it is live).\n"
            "RUN: every conversation of that run, in the order it ran them (a run id from\n"
            "     `status`, or a unique prefix).\n"
            "STEP: that step's session (a name, or a label as the manifest writes it: "
            "干活#round2).\n\n"
            "It reads sessions.db read-only, so it is safe while a flower runs. An unknown run "
            "or step is one line and exit status 2.",
        ),
        "super.help.follow": ("跑着的时候一直打印", "keep printing while it runs"),
        "super.help.logs": (
            "逐行打印一次运行的事件:时间、步骤、类别、文字(默认:最近一次运行)。\n\n"
            "RUN 是 status 列出的 run id,或能唯一确定的前缀。加 -f 时,在跑的 flower 的事件来一条"
            "打一条,那个 flower 结束时停(Ctrl-C 也停,退出码 130)。早于事件日志的运行没有日志:"
            "一行说明,退出码 1。不认识的运行是一行说明,退出码 2。",
            "Print a run's events, one line each: time, step, kind, text (default: the latest "
            "run).\n\nRUN is a run id from `status`, or a unique prefix. With -f it keeps "
            "printing the events of a live flower as they come and ends when that flower ends "
            "(Ctrl-C ends it too, exit status 130). A run from before event logs existed has "
            "none: one line, exit status 1. An unknown run is one line and exit status 2.",
        ),
        "super.help.script": (
            "JSON 格式的回合脚本(格式见下)",
            "JSON script of turns (the format is below)",
        ),
        "super.help.port": (
            "127.0.0.1 上的端口(0 = 随便一个空闲端口)",
            "port on 127.0.0.1 (0 = any free port)",
        ),
        "super.help.log": (
            "把每个请求作为一行 JSON 追加到这里",
            "append every request as a JSON line here",
        ),
        "super.help.model_server": (
            "在本机回环上按脚本提供 Anthropic Messages API(给测试和演示用)。\n\n"
            "开始监听后打印它的 URL,一直服务到 SIGTERM 或 Ctrl-C。让 CLI 连它:"
            "ANTHROPIC_BASE_URL=<url>、随便一个 ANTHROPIC_API_KEY、新的 HOME 和 CLAUDE_CONFIG_DIR,"
            "以及 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1(flower.services.cli_env 全都配好)。"
            "脚本格式的说明是英文的。",
            "Serve the Anthropic Messages API on loopback from a script (for tests and demos)."
            "\n\nPrints its URL once listening and serves until SIGTERM or Ctrl-C. Point the CLI "
            "at it with ANTHROPIC_BASE_URL=<url>, any ANTHROPIC_API_KEY, a fresh HOME and "
            "CLAUDE_CONFIG_DIR and CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 "
            "(flower.services.cli_env builds it all).",
        ),
        "super.help.keep": (
            "留下临时工作区,并打印它在哪",
            "keep the temporary workspace and print where it is",
        ),
        "super.help.worker": (
            "在这台机器上跑 supervisor 放到 Temporal 队列里的步骤尝试(每次一个 fork 出来的子进程,"
            "和本机跑一样)。运行状态必须在 PostgreSQL 里;凭证用这台机器自己的。",
            "Run the step attempts supervisors place on a Temporal queue, here (each in a forked "
            "child, as on the supervisor's machine). The run state must be in PostgreSQL; "
            "credentials are this machine's own.",
        ),
        "super.help.cluster": (
            "本机上的一个小集群(Temporal 开发服务器、临时 PostgreSQL、N 个 worker),试用和测试用。",
            "A cluster on this machine (the Temporal dev server, a throwaway PostgreSQL, N "
            "workers), for trying the cluster placement out and for tests.",
        ),
        "super.help.cluster_up": (
            "起一个本机集群,在 stdout 打出要 export 的两行(FLOWER_STATE、FLOWER_PLACEMENT);"
            "已经起着就再打一遍(死掉的 worker 重新起,--workers N 增减到 N 个,都会说)。"
            "它的服务器不验身份,本机任何用户都连得上:只在自己的机器上用。",
            "Start a cluster on this machine and print the two lines to export "
            "(FLOWER_STATE, FLOWER_PLACEMENT) on stdout; for one already up they are printed "
            "again, after a dead worker is started again and --workers N scales it (each said). "
            "Its servers take any local user's connection: for a machine of your own.",
        ),
        "super.help.cluster_down": (
            "停掉本机集群的 worker(各有 10 秒把手上的跑完)和两个服务器,删掉集群建的文件"
            "(它的运行状态随之而去)。",
            "Stop the cluster's workers (each gets 10 s to finish what it runs) and both "
            "servers, and remove what the cluster made (its run state goes with it).",
        ),
        "super.help.cluster_workers": (
            "几个 worker(新集群默认 2;在跑的集群会增减到这个数)",
            "how many workers (2 for a new cluster; a running one is scaled to N)",
        ),
        "super.help.cluster_dir": (
            "集群的文件放哪(默认 ~/.flower/cluster)",
            "where the cluster keeps its files (default ~/.flower/cluster)",
        ),
        "super.help.temporal": (
            "Temporal 服务的地址(默认取 TEMPORAL_ADDRESS 或 temporal.toml 的 profile;"
            "TLS、API key 也从那里读)",
            "the Temporal service's address (default: TEMPORAL_ADDRESS or the temporal.toml "
            "profile, where TLS and the API key are read from too)",
        ),
        "super.help.namespace": (
            "Temporal 的命名空间(默认 TEMPORAL_NAMESPACE、profile 里的,或 default)",
            "the Temporal namespace (default: TEMPORAL_NAMESPACE, the profile's, or default)",
        ),
        "super.help.queue": ("要领活的任务队列", "the task queue to take attempts from"),
        "super.help.metrics": (
            "在 主机:端口 上提供 Prometheus 指标(尝试在跑/完成/失败、接手、还回队列、待送的写入,"
            "加上 Temporal SDK 自己的)",
            "serve Prometheus metrics on HOST:PORT (attempts running/finished/failed, takeovers, "
            "hand-backs, writes waiting for the database, and the Temporal SDK's own)",
        ),
        "super.help.workers": (
            "列出向运行状态报到的集群 worker:主机、pid、槽位、各自在跑什么、最后一次报到。"
            "哪台机器都行,只要有状态地址(--state 或 FLOWER_STATE)。",
            "List the cluster's workers as they report to the run state: host, pid, slots, what "
            "each runs, when each last reported. From any machine with the state URL (--state "
            "or FLOWER_STATE).",
        ),
        "super.help.workers_queue": ("只列这个队列的", "only this queue's workers"),
        "super.help.workers_all": (
            "也列出已经停了的(停了一天内)",
            "also list workers that stopped (within the last day)",
        ),
        "super.help.slots": ("同时跑几个尝试", "attempts at once"),
        "super.help.worker_state": (
            "运行状态的 postgresql:// 地址(默认 FLOWER_STATE)",
            "the run state's postgresql:// URL (default: FLOWER_STATE)",
        ),
        "super.help.map": (
            "工作区在这台机器上的另一条路径:FROM=TO(可多次)",
            "where a workspace path is on this machine: FROM=TO (repeatable)",
        ),
        "super.help.demo": (
            "不要 key、不联网:对着脚本化的模型跑一个流程,在步骤中途 kill -9,再接着跑。"
            "显示的花费是脚本服务器报的模拟数,没花一分钱。",
            "No key, no network: run a flow against a scripted model, kill -9 it mid-step, "
            "resume. The costs shown are the scripted server's simulated figures: nothing is "
            "spent.",
        ),
    }
)


state_option = click.option(
    "--state", "state", default=None, metavar="URL", help=t("state.help.option")
)  # see supervisor.inspect.runstate

placement_option = click.option(
    "--placement",
    "placement",
    default=None,
    metavar="temporal://HOST:PORT/QUEUE",
    help=t("state.help.placement"),
)  # see supervisor.cluster.remote.choose_placement


workspace_option = click.option(
    "-w",
    "--workspace",
    type=click.Path(path_type=Path),
    default=Path("."),
    show_default=True,
    metavar="DIR",
    help=t("super.help.workspace_of"),
)

run_dir_option = click.option(
    "-r",
    "--run-dir",
    type=click.Path(path_type=Path),
    default=Path("runs"),
    show_default=True,
    metavar="DIR",
    help=t("super.help.run_dir"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, help=t("super.help"))
@click.version_option(
    __version__, "--version", prog_name="flower-super", message="%(prog)s %(version)s"
)
def main() -> None:
    """flower-super (its help is the catalogue's ``super.help``)."""


@main.command(help=t("super.help.start") + "\n\n" + t("state.help.where"))
@click.argument("ask", required=False, default="")
@click.option(
    "--flow",
    "flow_ref",
    metavar="FILE.py:ATTR|MODULE:ATTR",
    help=t("super.help.flow"),
)
@run_dir_option
@click.option(
    "-w",
    "--workspace",
    type=click.Path(path_type=Path),  # a file there: our own one line with a hint
    default=None,
    metavar="DIR",
    help=t("super.help.workspace"),
)
@click.option(
    "--new",
    is_flag=True,
    help=t("super.help.new"),
)
@click.option(
    "--no-trim",
    is_flag=True,
    help=t("super.help.no_trim"),
)
@click.option(
    "--rounds",
    type=int,
    default=3,
    show_default=True,
    metavar="N",
    help=t("super.help.rounds"),
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=1800.0,
    show_default=True,
    metavar="SECONDS",
    help=t("super.help.timeout"),
)
@click.option(
    "--no-goal",
    is_flag=True,
    help=t("super.help.no_goal"),
)
@state_option
@placement_option
def start(
    ask: str,
    flow_ref: str | None,
    run_dir: Path,
    workspace: Path | None,
    new: bool,
    no_trim: bool,
    rounds: int,
    timeout_s: float,
    no_goal: bool,
    state: str | None,
    placement: str | None,
) -> None:
    """``flower-super start`` (its help is the catalogue's ``super.help.start``)."""
    from supervisor.cluster.remote import choose_placement, cluster_placement
    from supervisor.run.flows import carried_words, load_flow, starter
    from supervisor.run.start import StartArgs, run_start
    from supervisor.terminal.terminal import Terminal

    ws = (workspace or Path.cwd()).expanduser()
    try:
        if ws.exists() and not ws.is_dir():
            raise FlowerError(t("cli.not_dir", ws=ws), hint=t("cli.not_dir.hint"))
        check_run_dir(run_dir)
        chosen = choose(state, ws)
        # Connected before anything is made: a state that cannot be used leaves no trace.
        opened = open_chosen(
            chosen, run_dir=run_dir.expanduser().absolute(), workspace=ws, create=True
        )
        warn_if_password_in_argv(state)  # once it runs: a mistake stays one line
        with starting(opened):  # the database going away now is waited for
            remote = choose_placement(placement, ws, opened, wait_s=START_WAIT_S, waiting=warn)
            said = None
            if flow_ref:
                wf = load_flow(flow_ref, ask)
                ws = workspace_dir(ws)
                given = ask
                ask, said = carried_words(opened, wf.name, ws.resolve(), ask, new=new)
                if ask != given:  # a callable ATTR builds its flow from the words
                    wf = load_flow(flow_ref, ask)
            else:
                ws = workspace_dir(ws)
                wf = starter(
                    ask,
                    ws,
                    run_dir,
                    new=new,
                    rounds=rounds,
                    timeout_s=timeout_s,
                    goal=not no_goal,
                    state=opened,
                )
            term = Terminal()
            if said:
                term.say(said)
            args = StartArgs(
                ask=ask,
                workspace=ws.resolve(),
                run_dir=run_dir.expanduser().absolute(),
                new=new,
                trim=not no_trim,
                command=_resume_command(
                    flow_ref,
                    run_dir,
                    workspace,
                    _starter_options(rounds, timeout_s, no_goal),
                    chosen.carry_args() + (["--placement", placement] if placement else []),
                    ask=ask,
                ),
                archive=bool(flow_ref),
                state=opened,
                placement=cluster_placement(remote, opened, wf, term.ask, trim=not no_trim),
            )
        code = run_start(wf, args, term)
    except FlowerError as exc:
        _fail(exc)
    sys.exit(ended(code))


def _starter_options(rounds: int, timeout_s: float, no_goal: bool) -> list[str]:
    """The starter flow's options as given (only those not at their default)."""
    out = [] if rounds == 3 else ["--rounds", str(rounds)]
    out += [] if timeout_s == 1800.0 else ["--timeout", f"{timeout_s:g}"]
    return out + (["--no-goal"] if no_goal else [])


def _resume_command(
    flow_ref: str | None,
    run_dir: Path,
    workspace: Path | None,
    options: list[str] | None = None,
    state_args: list[str] | None = None,
    *,
    ask: str = "",
) -> list[str]:
    """The command that carries this run on later (shown by status for a dead run);
    ``state_args``: :meth:`supervisor.inspect.runstate.Choice.carry_args`. A flow of the
    person's own gets its words again (``ctx["_ask"]`` shapes its steps' prompts: other
    words would send a finished step again); the starter flow keeps them in 需求.md and
    carries on without them."""
    cmd = ["flower-super", "start"]
    if flow_ref:
        cmd += ["--flow", flow_ref]
    else:
        cmd += options or []
    cmd += ["-r", str(run_dir.expanduser().absolute())]
    cmd += ["-w", str((workspace or Path.cwd()).expanduser().resolve())]
    cmd += state_args or []
    if flow_ref and ask:
        cmd += ["--", ask] if ask.startswith("-") else [ask]  # "--": "-…" words are words
    return cmd


@main.command(help=t("super.help.status"))
@run_dir_option
@workspace_option
@state_option
@click.option("--json", "as_json", is_flag=True, help=t("super.help.json"))
def status(run_dir: Path, workspace: Path, state: str | None, as_json: bool) -> None:
    """``flower-super status``: exit 0, 3 (dead and unfinished) or 2 (a mistake)."""
    from supervisor.inspect.status import collect, render_text

    try:
        with looking(run_dir, workspace, state) as seen:
            report = collect(seen)
    except FlowerError as exc:
        _fail(exc, as_json=as_json)
    if as_json:
        import json

        click.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        click.echo(render_text(report))
    sys.exit(3 if report.dead_unfinished else 0)


@main.command(help=t("super.help.cancel"))
@click.argument("run")
@run_dir_option
@workspace_option
@state_option
def cancel(run: str, run_dir: Path, workspace: Path, state: str | None) -> None:
    """``flower-super cancel RUN``."""
    from supervisor.inspect.cancel import cancel as cancel_run

    try:
        with looking(run_dir, workspace, state) as seen:
            done = cancel_run(seen.state, run)
    except FlowerError as exc:
        _fail(exc)
    rec = done.record
    if not done.stopped:
        click.echo(t("cancel.still_there", pid=rec.pid, run=rec.run))
        sys.exit(1)
    resume, export = resume_line(rec.command) if rec.command else ("flower-super start", None)
    click.echo(t("cancel.stopped", run=rec.run, pid=rec.pid, resume=resume))
    if export is not None:  # the URL given had a password: the command takes FLOWER_STATE
        click.echo(t("state.export", url=export))


@main.command(help=t("super.help.verify"))
@click.option(
    "--flow",
    "flow_ref",
    required=True,
    metavar="FILE.py:ATTR|MODULE:ATTR",
    help=t("super.help.verify_flow"),
)
def verify(flow_ref: str) -> None:
    """``flower-super verify --flow REF``."""
    from supervisor.run.flows import load_flow

    try:
        wf = load_flow(flow_ref)
    except FlowerError as exc:
        _fail(exc)
    click.echo(t("cli.verified", flow=wf.name, n=len(wf.steps)))


@main.command(help=t("super.help.show"))
@click.argument("what", metavar="[RUN | STEP]", required=False)
@run_dir_option
@workspace_option
@state_option
@click.option("--json", "as_json", is_flag=True, help=t("super.help.show_json"))
def show(
    what: str | None, run_dir: Path, workspace: Path, state: str | None, as_json: bool
) -> None:
    """``flower-super show [RUN | STEP]``."""
    from supervisor.inspect.show import run

    try:
        with looking(run_dir, workspace, state) as seen:
            run(what, seen.state, as_json)
    except FlowerError as exc:
        _fail(exc, as_json=as_json)


@main.command(help=t("super.help.logs"))
@click.argument("run", required=False)
@click.option("-f", "--follow", "follow_", is_flag=True, help=t("super.help.follow"))
@run_dir_option
@workspace_option
@state_option
def logs(run: str | None, follow_: bool, run_dir: Path, workspace: Path, state: str | None) -> None:
    """``flower-super logs [-f] [RUN]``."""
    from supervisor.inspect.logs import run as run_logs

    try:
        with looking(run_dir, workspace, state) as seen:
            run_logs(run, follow_, seen.state)
    except FlowerError as exc:
        _fail(exc)


@main.group(help=t("super.help.state"))
def state() -> None:
    """``flower-super state``: the run state itself."""


@state.command("export", help=t("super.help.export"))
@click.option("--to", "to", required=True, metavar="URL", help=t("super.help.export_to"))
@run_dir_option
@workspace_option
def export(to: str, run_dir: Path, workspace: Path) -> None:
    """``flower-super state export --to URL``."""
    from flower.state.export import export_state

    try:
        done = export_state(
            run_dir.expanduser().absolute(), workspace.expanduser().resolve(), to, say=click.echo
        )
    except FlowerError as exc:
        _fail(exc)
    click.echo(done.summary())


class _ScriptFormatHelp(click.Command):
    """model-server's help ends with flower.testing.SCRIPT_FORMAT, every paragraph marked \\b
    so Click prints it as written; read only when the help is shown (not by every command)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from flower.services._format import SCRIPT_FORMAT

        self.epilog = "\n\n".join("\b\n" + part for part in SCRIPT_FORMAT.split("\n\n"))
        super().format_epilog(ctx, formatter)


@main.command(help=t("super.help.ui"))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDRESS",
    help=t("super.help.ui_host"),
)
@click.option("--port", type=int, default=8765, show_default=True, help=t("super.help.ui_port"))
@run_dir_option
@workspace_option
@state_option
def ui(host: str, port: int, run_dir: Path, workspace: Path, state: str | None) -> None:
    """``flower-super ui``: the web view of the runs ``status`` sees."""
    import ipaddress

    from supervisor.ui.server import UI, serve

    warn_if_password_in_argv(state)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    try:
        with looking(run_dir, workspace, state) as seen:
            view = UI(seen.state, loopback=loopback)

            def ready(bound: int) -> None:
                shown = f"[{host}]" if ":" in host else host
                click.echo(t("ui.serving", url=f"http://{shown}:{bound}/?token={view.token}"))
                note = t("ui.serving.note") if loopback else t("ui.serving.note.host", host=host)
                click.echo(note)

            try:
                serve(view, host, port, ready)
            except OSError as exc:
                raise FlowerError(
                    t("ui.port_taken", host=host, port=port, why=exc.strerror or exc),
                    hint=t("ui.port_taken.hint"),
                ) from None
    except FlowerError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)


@main.command("model-server", cls=_ScriptFormatHelp, help=t("super.help.model_server"))
@click.option(
    "--script",
    "script_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    metavar="FILE",
    help=t("super.help.script"),
)
@click.option("--port", type=int, default=0, show_default=True, help=t("super.help.port"))
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help=t("super.help.log"),
)
def model_server(script_path: str, port: int, log_path: str | None) -> None:
    """``flower-super model-server``."""
    from flower.services.model_server import main as serve

    argv = ["--script", script_path, "--port", str(port)]
    if log_path:
        argv += ["--log", log_path]
    sys.exit(serve(argv))


@main.command(help=t("super.help.demo"))
@click.option("--keep", is_flag=True, help=t("super.help.keep"))
def demo(keep: bool) -> None:
    """``flower-super demo``."""
    from supervisor.commands.demo import run_demo

    try:
        sys.exit(run_demo(keep=keep))
    except FlowerError as exc:
        _fail(exc)


@main.command(help=t("super.help.worker"))
@click.option(
    "--temporal", "target", default="", metavar="HOST:PORT", help=t("super.help.temporal")
)
@click.option("--namespace", default="", metavar="NS", help=t("super.help.namespace"))
@click.option("--queue", required=True, metavar="NAME", help=t("super.help.queue"))
@click.option(
    "--slots",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help=t("super.help.slots"),
)
@click.option("--state", "state", metavar="URL", default=None, help=t("super.help.worker_state"))
@click.option("--map", "maps", multiple=True, metavar="FROM=TO", help=t("super.help.map"))
@click.option("--metrics", default="", metavar="HOST:PORT", help=t("super.help.metrics"))
def worker(
    target: str,
    namespace: str,
    queue: str,
    slots: int,
    state: str | None,
    maps: tuple[str, ...],
    metrics: str,
) -> None:
    """``flower-super worker``."""
    from supervisor.cluster.worker import WorkerConfig, parse_map, run_worker

    warn_if_password_in_argv(state)
    try:
        cfg = WorkerConfig(
            target,
            queue,
            slots,
            state,
            [parse_map(m) for m in maps],
            namespace=namespace,
            metrics=metrics,
        )
        sys.exit(run_worker(cfg))
    except FlowerError as exc:
        _fail(exc)


@main.command(help=t("super.help.workers"))
@click.option("--queue", default=None, metavar="NAME", help=t("super.help.workers_queue"))
@click.option("--all", "everyone", is_flag=True, help=t("super.help.workers_all"))
@state_option
@click.option("--json", "as_json", is_flag=True, help=t("super.help.json"))
def workers(queue: str | None, everyone: bool, state: str | None, as_json: bool) -> None:
    """``flower-super workers``: exit 0, or 1 when no worker (of ``--queue``) is alive."""
    from supervisor.inspect.workers import collect, render_text

    warn_if_password_in_argv(state)
    try:
        with looking(Path("runs"), Path("."), state) as seen:
            views = collect(seen.state, queue, everyone)
            where = seen.state.where
    except FlowerError as exc:
        _fail(exc, as_json=as_json)
    if as_json:
        import json

        click.echo(json.dumps([v.to_json() for v in views], ensure_ascii=False, indent=2))
    else:
        click.echo(render_text(views, where, queue))
        if not views:
            click.echo(t("cli.hint", hint=t("workers.none.hint")), err=True)
    sys.exit(0 if any(v.state == "alive" for v in views) else 1)


@main.group(help=t("super.help.cluster"))
def cluster() -> None:
    pass


cluster_dir_option = click.option(
    "--dir",
    "where",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    metavar="DIR",
    help=t("super.help.cluster_dir"),
)


@cluster.command("up", help=t("super.help.cluster_up"))
@click.option(
    "--workers",
    type=int,
    default=None,
    metavar="N",
    help=t("super.help.cluster_workers"),
)
@cluster_dir_option
def cluster_up(workers: int | None, where: Path | None) -> None:
    """``flower-super cluster up``: the two export lines on stdout, the rest on stderr."""
    from supervisor.cluster.local import default_dir, dir_args, up

    def say(line: str) -> None:
        click.echo(line, err=True)

    try:
        found = up(where or default_dir(), workers, say)
    except FlowerError as exc:
        _fail(exc)
    say(t("cluster.export", dir=dir_args(found.dir)))
    for line in found.exports():
        click.echo(line)


@cluster.command("down", help=t("super.help.cluster_down"))
@cluster_dir_option
def cluster_down(where: Path | None) -> None:
    from supervisor.cluster.local import NothingUp, default_dir, down

    try:
        down(where or default_dir(), lambda line: click.echo(line, err=True))
    except NothingUp as exc:  # nothing was done: not a success
        click.echo(f"flower-super: {exc.message}", err=True)
        click.echo(t("cli.hint", hint=exc.hint), err=True)
        sys.exit(1)
    except FlowerError as exc:
        _fail(exc)


def workspace_dir(path: Path) -> Path:
    """The workspace ``-w`` names, resolved, created when missing (as the reference's
    ``flower`` does it: ``mkdir -p``); one line with a hint when it cannot be."""
    ws = path.expanduser().resolve()
    if ws.exists() and not ws.is_dir():
        raise FlowerError(t("cli.not_dir", ws=ws), hint=t("cli.not_dir.hint"))
    try:
        ws.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FlowerError(t("cli.ws_failed", ws=ws, error=exc.strerror or exc)) from None
    return ws


def check_run_dir(run_dir: Path) -> None:
    """A run directory that cannot exist (it is a file, or lies under one) is a mistake."""
    path = run_dir.expanduser().absolute()
    for level in (path, *path.parents):
        if level.is_dir():
            return
        if level.exists():
            if level == path:
                message = t("cli.run_dir_file", path=path)
            else:
                message = t("cli.run_dir_under_file", path=path, level=level)
            raise FlowerError(message, hint=t("cli.run_dir.hint"))


def _fail(exc: FlowerError, *, as_json: bool = False) -> None:
    if as_json:  # a script reading --json gets JSON, errors included
        import json

        click.echo(json.dumps({"error": exc.message, "hint": exc.hint}, ensure_ascii=False))
        sys.exit(2)
    click.echo(f"flower-super: {exc.message}", err=True)
    if exc.hint:
        click.echo(t("cli.hint", hint=exc.hint), err=True)
    sys.exit(ended(2))
