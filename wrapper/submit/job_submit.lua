--[[
jobwrap's job_submit.lua: checks a batch job's #JOBWRAP directives at submit time and
makes the job self-healing (requeueable, with a pre-timeout checkpoint signal).

Loaded by slurmctld's job_submit/lua plugin (slurm.conf: JobSubmitPlugins=lua; the file
sits beside slurm.conf as job_submit.lua). Install it with `jobwrap install-lua PATH`,
which fills SITE below from the jobwrap config.

The directive rules and messages are those of wrapper/submit/directives.py (parse_script), and
for --stage-in/--stage-out those of wrapper/staging/spec.py, so a job is refused here,
by sbatch, with the very message the prolog would have written hours later.
tests/unit/submit/test_lua_agreement.py holds them to the same table and to generated headers.

Written for Lua 5.1 (what Debian's Slurm 22.05 plugin links) and 5.3: no goto, no
integer division, no bit operators, no table.unpack.

It runs inside slurmctld, under its locks, on the user's script: every step is linear
in the input and the input is capped (the same caps in wrapper/submit/directives.py).
- Only the script's first HEADER_LINES lines, and of them those ending within its first
  HEADER_BYTES bytes, are read for directives: a longer header's later lines are not.
- Lines, blanks and words are found with string.find (anchored patterns whose
  backtracking is one character at a time) and built with table.concat: never a
  pattern retried at every blank of a run, never a string grown a character at a time.
- Every number has a range, its digits counted before tonumber: --max-restarts 0 to
  1000, --hang-timeout up to 30 days.
--]]

-- BEGIN SITE (rewritten by `jobwrap install-lua`; edit the jobwrap config instead)
local SITE = {
    -- Make batch jobs requeueable unless they opt out (#JOBWRAP/#SBATCH --no-requeue).
    requeue = true,
    -- The site's --max-restarts default ([restart] max_restarts); 0 means jobs are not
    -- restarted unless they ask, so they are not made requeueable either.
    max_restarts = 3,
    -- Jobs asking for more restarts than this are refused (-1: no limit).
    max_restarts_limit = -1,
    -- Pre-timeout checkpoint signal ([supervisor] walltime_signal / walltime_lead):
    -- its number, and seconds before the time limit; 0 seconds: none.
    signal_name = "URG",
    signal_number = 23,
    signal_lead = 300,
    -- Spare nodes a job gets when it asks none ([restart] spare_nodes): "PART=N,...",
    -- per partition; "" none.
    spare_nodes = "",
    -- The jobwrap command on the compute nodes ([restart] batch_wrapper): a shell batch
    -- script then runs under `jobwrap run`, restarting inside its allocation; "" off.
    batch_wrapper = "",
}
-- END SITE

local PREFIX = "#JOBWRAP"
local HEADER_BYTES = 262144 -- 256 KiB
local HEADER_LINES = 1000
local MAX_NUMBER_DIGITS = 9 -- a whole-number value longer than this is out of range
local MAX_DURATION_CHARS = 32 -- a duration longer than this is none

-- Declared once, in the order wrapper/submit/directives.py's OPTIONS lists them (the order of
-- the "valid options" in messages).
local OPTIONS = {
    { name = "--checkpoint-dir", kind = "path" },
    { name = "--checkpoint-glob", kind = "text" },
    { name = "--checkpoint-marker", kind = "text" },
    { name = "--max-restarts", kind = "int", most = 1000 },
    { name = "--hang-timeout", kind = "duration", most = 30 * 86400 },
    { name = "--stage-in", kind = "spec" },
    { name = "--stage-out", kind = "spec" },
    { name = "--no-requeue", kind = "flag" },
    { name = "--spare-nodes", kind = "int", most = 64 },
}
local BY_NAME = {}
local VALID_NAMES = {}
for i, option in ipairs(OPTIONS) do
    BY_NAME[option.name] = option
    VALID_NAMES[i] = option.name
end
local VALID = table.concat(VALID_NAMES, ", ")

-- Python's str.strip() for the ASCII whitespace it knows (\x1c-\x1f included).
local WS = "[ \t\n\r\v\f\28\29\30\31]"
local NOT_WS = "[^ \t\n\r\v\f\28\29\30\31]"
-- Python's str.splitlines() line boundaries, for the ASCII range (\r\n is one).
local BOUNDARY = "[\n\r\v\f\28\29\30]"
-- Where the end of the last non-blank is: ".*" takes all and gives back one character
-- at a time until one is no blank, so this is linear (unlike WS .. "+$", which is
-- retried at every blank of a run and is quadratic in it).
local LAST_NOT_WS = "^.*" .. NOT_WS .. "()"

local function strip(text)
    local first = text:find(NOT_WS)
    if first == nil then
        return ""
    end
    return text:sub(first, text:match(LAST_NOT_WS) - 1)
end

local function starts_with(text, prefix)
    return text:sub(1, #prefix) == prefix
end

-- The length of the valid UTF-8 sequence at byte i of text, or nil where Python's
-- decoder (with surrogateescape, as the hooks decode scripts) makes the byte a lone
-- surrogate \udcXX.
local function utf8_length(text, i)
    local b = text:byte(i)
    if b < 0x80 then
        return 1
    end
    local n, lo, hi
    if b >= 0xC2 and b <= 0xDF then
        n, lo, hi = 2, 0x80, 0xBF
    elseif b == 0xE0 then
        n, lo, hi = 3, 0xA0, 0xBF
    elseif b == 0xED then
        n, lo, hi = 3, 0x80, 0x9F
    elseif b >= 0xE1 and b <= 0xEF then
        n, lo, hi = 3, 0x80, 0xBF
    elseif b == 0xF0 then
        n, lo, hi = 4, 0x90, 0xBF
    elseif b >= 0xF1 and b <= 0xF3 then
        n, lo, hi = 4, 0x80, 0xBF
    elseif b == 0xF4 then
        n, lo, hi = 4, 0x80, 0x8F
    else
        return nil
    end
    local second = text:byte(i + 1)
    if second == nil or second < lo or second > hi then
        return nil
    end
    for k = 2, n - 1 do
        local c = text:byte(i + k)
        if c == nil or c < 0x80 or c > 0xBF then
            return nil
        end
    end
    return n
end

local function valid_utf8(text)
    local i = 1
    while true do
        local at = text:find("[\128-\255]", i)
        if at == nil then
            return true
        end
        local n = utf8_length(text, at)
        if n == nil then
            return false
        end
        i = at + n
    end
end

-- Python's repr() of a str, for the ASCII range, the UTF-8 C1 controls and bytes that
-- are not UTF-8, so that messages quote values exactly as wrapper/submit/directives.py does.
local function py_repr(text)
    local quote = "'"
    if text:find("'", 1, true) and not text:find('"', 1, true) then
        quote = '"'
    end
    local out = {}
    local i, n = 1, #text
    while i <= n do
        local c = text:sub(i, i)
        local b = c:byte()
        if c == "\\" then
            out[#out + 1] = "\\\\"
        elseif c == quote then
            out[#out + 1] = "\\" .. quote
        elseif c == "\t" then
            out[#out + 1] = "\\t"
        elseif c == "\n" then
            out[#out + 1] = "\\n"
        elseif c == "\r" then
            out[#out + 1] = "\\r"
        elseif b < 32 or b == 127 then
            out[#out + 1] = string.format("\\x%02x", b)
        elseif b >= 0x80 then
            local length = utf8_length(text, i)
            local nb = text:byte(i + 1)
            if length == nil then
                out[#out + 1] = string.format("\\udc%02x", b)
            elseif b == 0xC2 and ((nb >= 0x80 and nb <= 0xA0) or nb == 0xAD) then
                -- U+0080..U+00A0 and U+00AD are not printable: Python writes \xNN.
                out[#out + 1] = string.format("\\x%02x", nb)
                i = i + 1
            else
                out[#out + 1] = text:sub(i, i + length - 1)
                i = i + length - 1
            end
        else
            out[#out + 1] = c
        end
        i = i + 1
    end
    return quote .. table.concat(out) .. quote
end

-- The part of the script read for directives: the whole lines within its first
-- HEADER_BYTES bytes (all of it when it is shorter).
local function header(script)
    if #script <= HEADER_BYTES then
        return script
    end
    local head = script:sub(1, HEADER_BYTES)
    local after = head:match("^.*" .. BOUNDARY .. "()")
    return after and head:sub(1, after - 1) or ""
end

-- Python's splitlines() for the ASCII line boundaries: the header's first HEADER_LINES.
local function split_lines(script)
    local lines = {}
    local text = header(script)
    local start, n = 1, #text
    while start <= n and #lines < HEADER_LINES do
        local at = text:find(BOUNDARY, start)
        if at == nil then
            lines[#lines + 1] = text:sub(start)
            break
        end
        lines[#lines + 1] = text:sub(start, at - 1)
        if text:byte(at) == 13 and text:byte(at + 1) == 10 then
            start = at + 2
        else
            start = at + 1
        end
    end
    return lines
end

-- The comment lines of the script's header (like #SBATCH: the header ends at the first
-- command), stripped, as {number, line}: read once, for #JOBWRAP and #SBATCH alike.
local function read_header(script)
    local out = {}
    for number, raw in ipairs(split_lines(script)) do
        local line = strip(raw)
        local skip = (number == 1 and starts_with(line, "#!")) or line == ""
        if not skip then
            if line:sub(1, 1) ~= "#" then
                break
            end
            out[#out + 1] = { number, line }
        end
    end
    return out
end

-- The header's lines that start with `prefix`, as {number, text after the prefix}.
local function header_lines(header, prefix)
    local out = {}
    for _, item in ipairs(header) do
        local number, line = item[1], item[2]
        local after = line:sub(#prefix + 1, #prefix + 1)
        if starts_with(line, prefix) and (after == "" or after:find(WS)) then
            out[#out + 1] = { number, strip(line:sub(#prefix + 1)) }
        end
    end
    return out
end

-- Python's shlex.split(text, comments=False): POSIX quoting; returns the words, or
-- nil and shlex's own error text. Each run of plain characters is found with one
-- search and kept as one piece; a word is its pieces joined once.
local SHELL_SPECIAL = "[ \t\r\n'\"\\]"
local find, sub, byte, concat = string.find, string.sub, string.byte, table.concat
local B_SPACE, B_TAB, B_CR, B_LF = 32, 9, 13, 10
local B_BACKSLASH, B_SQUOTE, B_DQUOTE = 92, 39, 34
local function shell_words(text)
    local words = {}
    local pieces = nil -- the word being read; nil between words
    local np = 0 -- pieces in it
    local i, n = 1, #text
    while i <= n do
        local at = find(text, SHELL_SPECIAL, i) or (n + 1)
        if at > i then
            if not pieces then
                pieces, np = {}, 0
            end
            np = np + 1
            pieces[np] = sub(text, i, at - 1)
        end
        if at > n then
            break
        end
        local c = byte(text, at)
        if c == B_SPACE or c == B_TAB or c == B_CR or c == B_LF then
            if pieces then
                words[#words + 1] = concat(pieces)
                pieces = nil
            end
            i = find(text, "[^ \t\r\n]", at + 1) or (n + 1) -- the whole run of blanks
        else
            if not pieces then
                pieces, np = {}, 0
            end
            if c == B_BACKSLASH then
                if at == n then
                    return nil, "No escaped character"
                end
                np = np + 1
                pieces[np] = sub(text, at + 1, at + 1)
                i = at + 2
            elseif c == B_SQUOTE then
                local close = find(text, "'", at + 1, true)
                if close == nil then
                    return nil, "No closing quotation"
                end
                np = np + 1
                pieces[np] = sub(text, at + 1, close - 1)
                i = close + 1
            else -- a double quote: a backslash escapes only " and \ (and stays otherwise)
                local j = at + 1
                while true do
                    local q = find(text, '["\\]', j)
                    if q == nil then
                        return nil, "No closing quotation"
                    end
                    np = np + 1
                    pieces[np] = sub(text, j, q - 1)
                    if byte(text, q) == B_DQUOTE then
                        i = q + 1
                        break
                    end
                    if q == n then
                        return nil, "No escaped character"
                    end
                    local nextc = byte(text, q + 1)
                    if nextc ~= B_DQUOTE and nextc ~= B_BACKSLASH then
                        np = np + 1
                        pieces[np] = "\\"
                    end
                    np = np + 1
                    pieces[np] = sub(text, q + 1, q + 1)
                    j = q + 2
                end
            end
        end
    end
    if pieces then
        words[#words + 1] = concat(pieces)
    end
    return words
end

-- Python's int() on a str: whitespace, a sign, digits with single underscores.
local function py_int(text)
    local body = strip(text)
    local sign = 1
    local first = body:sub(1, 1)
    if first == "+" or first == "-" then
        if first == "-" then
            sign = -1
        end
        body = body:sub(2)
    end
    if not body:find("^%d[%d_]*$") or body:find("__") or body:sub(-1) == "_" then
        return nil
    end
    -- A float (Lua 5.3 integers would wrap in the products below); exact below 2^53.
    return sign * (tonumber((body:gsub("_", ""))) + 0.0)
end

-- wrapper.submit.directives.parse_duration: seconds, or nil when it is no duration.
local function parse_duration(text)
    local value = strip(text):lower()
    if value == "" or #value > MAX_DURATION_CHARS or value:find("[\128-\255]") then
        return nil
    end
    if value:find("^%d+$") then
        return tonumber(value) + 0.0
    end
    if value:find(":", 1, true) or value:find("-", 1, true) then
        local days = 0
        local dash = value:find("-", 1, true)
        if dash then
            days = py_int(value:sub(1, dash - 1))
            if days == nil then
                return nil
            end
            value = value:sub(dash + 1)
        end
        local parts = {}
        for piece in (value .. ":"):gmatch("([^:]*):") do
            local number = py_int(piece)
            if number == nil or number < 0 then
                return nil
            end
            parts[#parts + 1] = number
        end
        if #parts > 3 then
            return nil
        end
        while #parts < 3 do
            table.insert(parts, 1, 0)
        end
        return days * 86400 + parts[1] * 3600 + parts[2] * 60 + parts[3]
    end
    -- (\d+d)?(\d+h)?(\d+m)?(\d+s)?, at least one of them.
    local total, pos, any = 0, 1, false
    local units = { { "d", 86400 }, { "h", 3600 }, { "m", 60 }, { "s", 1 } }
    for _, unit in ipairs(units) do
        local digits = value:match("^(%d+)" .. unit[1], pos)
        if digits then
            total = total + (tonumber(digits) + 0.0) * unit[2]
            pos = pos + #digits + 1
            any = true
        end
    end
    if not any or pos <= #value then
        return nil
    end
    return total
end

-- Stage specs: the rules and messages of wrapper/staging/spec.py (parse_stage_in,
-- parse_stage_out), which the prolog applies. SRC of a stage-in and DEST of a stage-out
-- are on shared storage; the other side must stay inside the job's scratch folder.
local MAX_PATH_BYTES = 4095
local MAX_NAME_BYTES = 255
local STAGE_IN_USAGE = "--stage-in=SRC[:DEST[:unpack]]"
local STAGE_OUT_USAGE = "--stage-out=SRC:DEST"

local function split_on(text, sep)
    local parts = {}
    for piece in (text .. sep):gmatch("([^" .. sep .. "]*)" .. sep) do
        parts[#parts + 1] = piece
    end
    return parts
end

-- Python's posixpath.normpath.
local function normpath(path)
    if path == "" then
        return "."
    end
    local initial = 0
    if starts_with(path, "/") then
        initial = (starts_with(path, "//") and not starts_with(path, "///")) and 2 or 1
    end
    local comps = {}
    for _, comp in ipairs(split_on(path, "/")) do
        if comp ~= "" and comp ~= "." then
            if comp ~= ".." or (initial == 0 and #comps == 0)
                or (#comps > 0 and comps[#comps] == "..") then
                comps[#comps + 1] = comp
            elseif #comps > 0 then
                comps[#comps] = nil
            end
        end
    end
    local out = string.rep("/", initial) .. table.concat(comps, "/")
    return out ~= "" and out or "."
end

local function common_checks(text, where, tilde_hint)
    if text == "" then
        return where .. " is empty; give a path"
    end
    local bad = text:match("[\1-\31\127]")
    if bad then
        return string.format("%s contains the control character %s; use printable names",
            where, py_repr(bad))
    end
    if not valid_utf8(text) then
        return where .. " is not valid UTF-8; rename it"
    end
    if #text > MAX_PATH_BYTES then
        return string.format("%s is longer than %d bytes; use a shorter path", where,
            MAX_PATH_BYTES)
    end
    if starts_with(text, "~") then
        return string.format("%s starts with '~', which is not expanded; %s", where, tilde_hint)
    end
    return nil
end

-- A path inside the scratch folder: nil when it is fine, else the message.
local function scratch_path(text, directive, role)
    local where = string.format("%s: %s %s", directive, role, py_repr(text))
    local problem = common_checks(text, where, "name a path inside the scratch folder, "
        .. "e.g. 'data'")
    if problem then
        return problem
    end
    if starts_with(text, "/") then
        local last = text:match("^.*[^/]()") -- linear, unlike "/+$"
        local example = last and text:sub(1, last - 1):gsub("^/+", "") or ""
        return string.format("%s is absolute; %s is relative to the job's scratch folder, "
            .. "e.g. %s", where, role, py_repr(example ~= "" and example or "data"))
    end
    local parts = {}
    for _, part in ipairs(split_on(text, "/")) do
        if part ~= "" and part ~= "." then
            parts[#parts + 1] = part
        end
    end
    for _, part in ipairs(parts) do
        if part == ".." then
            return where .. " uses '..' to leave the scratch folder; name a path inside it, "
                .. "e.g. 'data'"
        end
    end
    for _, part in ipairs(parts) do
        if #part > MAX_NAME_BYTES then
            return string.format("%s has a component longer than %d bytes; use shorter names",
                where, MAX_NAME_BYTES)
        end
    end
    if parts[1] and starts_with(parts[1], "~") then -- "./~": its normal form starts with '~'
        return where .. " starts with '~' once './' is dropped, which is not expanded; name a "
            .. "path inside the scratch folder, e.g. 'data'"
    end
    return nil
end

-- A path on shared storage: the value it is used as, or nil and the message.
local function shared_path(text, directive, role)
    local where = string.format("%s: %s %s", directive, role, py_repr(text))
    local problem = common_checks(text, where, "write the full path")
    if problem then
        return nil, problem
    end
    return text == "/" and text or normpath(text)
end

local function split_spec(value, directive, usage)
    if value == "" then
        return nil, string.format("%s: the value is empty; write %s", directive, usage)
    end
    if value:find("://", 1, true) then
        return nil, string.format("%s: this looks like a URL; staging copies paths on file "
            .. "systems mounted on the node: write %s", directive, usage)
    end
    local parts = split_on(value, ":")
    if #parts > 3 then
        return nil, string.format("%s: too many ':' (SRC and DEST cannot contain ':'); "
            .. "write %s", directive, usage)
    end
    return parts
end

local function check_stage_in(value)
    local directive = "--stage-in=" .. value
    local parts, problem = split_spec(value, directive, STAGE_IN_USAGE)
    if parts == nil then
        return problem
    end
    if #parts == 3 and parts[3] ~= "unpack" then
        return string.format("%s: unknown mode %s; the only mode is 'unpack' "
            .. "(--stage-in=SRC:DEST:unpack)", directive, py_repr(parts[3]))
    end
    local source
    source, problem = shared_path(parts[1], directive, "SRC")
    if source == nil then
        return problem
    end
    if #parts >= 2 then
        return scratch_path(parts[2], directive, "DEST")
    end
    local name = normpath(source):match("([^/]*)$")
    if name == "" or name == "." or name == ".." then
        return string.format("%s: cannot name the copy after SRC %s; give DEST: "
            .. "--stage-in=SRC:DEST", directive, py_repr(source))
    end
    return scratch_path(name, directive, "DEST")
end

local function check_stage_out(value)
    local directive = "--stage-out=" .. value
    local parts, problem = split_spec(value, directive, STAGE_OUT_USAGE)
    if parts == nil then
        return problem
    end
    if #parts ~= 2 then
        return directive .. ": expected SRC:DEST (SRC inside the scratch folder, DEST on "
            .. "shared storage), e.g. --stage-out=results:/shared/me/run1"
    end
    problem = scratch_path(parts[1], directive, "SRC")
    if problem then
        return problem
    end
    local _
    _, problem = shared_path(parts[2], directive, "DEST")
    return problem
end

-- wrapper.submit.directives._convert: the value, or nil and the message.
local function convert(option, value, where, previous)
    local name = option.name
    if value:find("\0", 1, true) or value:find("\n", 1, true) then
        return nil, string.format("%s: %s value holds a control character", where, name)
    end
    if option.kind == "int" then
        -- The digits are counted before tonumber: never a 4,301-digit conversion.
        if #value > MAX_NUMBER_DIGITS or not value:find("^%d+$")
            or tonumber(value) > option.most then
            return nil, string.format("%s: %s=%s: expected a whole number from 0 to %d, "
                .. "e.g. %s=3", where, name, py_repr(value), option.most, name)
        end
        return tonumber(value)
    end
    if option.kind == "duration" then
        if name == "--hang-timeout" and value == "off" then
            return 0 -- no hang detection for this job
        end
        local seconds = parse_duration(value)
        if seconds == nil then
            return nil, string.format("%s: %s=%s: expected a duration such as 90s, 30m, "
                .. "1h30m or 01:30:00, at most 30 days", where, name, py_repr(value))
        end
        if seconds <= 0 then
            return nil, string.format("%s: %s must be longer than 0 s", where, name)
        end
        if seconds > option.most then
            return nil, string.format("%s: %s=%s: at most 30 days (%d s)", where, name,
                py_repr(value), option.most)
        end
        return seconds
    end
    if value == "" then
        return nil, string.format("%s: %s needs a non-empty value", where, name)
    end
    if option.kind == "spec" then
        local check = name == "--stage-in" and check_stage_in or check_stage_out
        local problem = check(value)
        if problem then
            return nil, where .. ": " .. problem
        end
        local list = previous or {} -- appended in place: k directives cost k, not k^2
        list[#list + 1] = value
        return list
    end
    return value
end

-- wrapper.submit.directives.parse_args over {number, word} items.
local function parse_words(items)
    local values = {}
    local given = {} -- name -> {line number, the value as written}, for site messages
    local i = 1
    while i <= #items do
        local number, word = items[i][1], items[i][2]
        local where = "#JOBWRAP line " .. number
        local name, value
        local eq = word:find("=", 1, true)
        if eq then
            name, value = word:sub(1, eq - 1), word:sub(eq + 1)
        else
            name = word
        end
        local option = BY_NAME[name]
        if option == nil then
            return nil, string.format("%s: unknown option %s; valid options: %s", where,
                py_repr(name), VALID)
        end
        if option.kind == "flag" then
            if eq then
                return nil, string.format("%s: %s takes no value", where, name)
            end
            values[name] = true
            i = i + 1
        else
            if not eq then
                if i + 1 > #items or starts_with(items[i + 1][2], "--") then
                    return nil, string.format("%s: %s needs a value (%s=VALUE)", where,
                        name, name)
                end
                value = items[i + 1][2]
                i = i + 1
            end
            i = i + 1
            local converted, problem = convert(option, value, where, values[name])
            if problem then
                return nil, problem
            end
            values[name] = converted
            given[name] = { number, value }
        end
    end
    return values, given
end

-- wrapper.submit.directives.parse_script: the options by name, or nil and the message.
-- Every line is split before any option is read, as there: a quoting error anywhere
-- is reported first.
local function parse_script(header)
    local items = {}
    for _, line in ipairs(header_lines(header, PREFIX)) do
        local number, text = line[1], line[2]
        local words, problem = shell_words(text)
        if words == nil then
            return nil, string.format("#JOBWRAP line %d: %s in %s", number, problem,
                py_repr(text))
        end
        for _, word in ipairs(words) do
            items[#items + 1] = { number, word }
        end
    end
    return parse_words(items)
end

-- Whether an #SBATCH line of the header says --no-requeue.
local function sbatch_no_requeue(header)
    local found = false
    for _, line in ipairs(header_lines(header, "#SBATCH")) do
        for _, word in ipairs(shell_words(line[2]) or {}) do
            if word == "--no-requeue" then
                found = true
            elseif word == "--requeue" then
                found = false -- sbatch: the later of the two wins
            end
        end
    end
    return found
end

local function no_val16()
    return (slurm and slurm.NO_VAL16) or 65534
end

local function is_unset16(value)
    return value == nil or value == no_val16()
end

-- Requeue: the job's explicit choice wins; #JOBWRAP --no-requeue always does.
local function decide_requeue(job_desc, options, header)
    if options["--no-requeue"] then
        return 0, "#JOBWRAP --no-requeue"
    end
    if not is_unset16(job_desc.requeue) then
        return nil, "the job's own --requeue/--no-requeue"
    end
    if sbatch_no_requeue(header) then
        return 0, "#SBATCH --no-requeue"
    end
    local restarts = options["--max-restarts"]
    if restarts == nil then
        restarts = SITE.max_restarts
    end
    if not SITE.requeue or restarts == 0 then
        return nil, "no restarts wanted"
    end
    return 1, "jobwrap restarts failed jobs"
end

-- The pre-timeout signal (sbatch --signal=SIG@LEAD). Slurm's job_submit/lua plugin
-- (22.05, and every release up to the one this was written against) exposes no
-- warn_signal/warn_time/warn_flags fields: reading them gives nil and setting them only
-- logs "unrecognized field". So they are set only where the plugin reads them back as
-- numbers; elsewhere jobwrap's supervisor sends the same signal at the same lead
-- ([supervisor] walltime_signal / walltime_lead).
local function add_signal(job_desc)
    if SITE.signal_lead <= 0 or SITE.signal_number <= 0 then
        return "off"
    end
    local current = job_desc.warn_signal
    if type(current) ~= "number" then
        return "left to the supervisor"
    end
    if current ~= 0 and current ~= no_val16() then
        return "the job's own"
    end
    job_desc.warn_signal = SITE.signal_number
    job_desc.warn_time = SITE.signal_lead
    -- No KILL_JOB_BATCH flag: the job's steps get it, as from the supervisor.
    job_desc.warn_flags = 0
    return string.format("%s@%d", SITE.signal_name, SITE.signal_lead)
end

-- What every node's prolog needs of the script, kept in the job's Extra field, which
-- Slurm 23.02+ hands each prolog as SLURM_JOB_EXTRA: the header's #JOBWRAP lines and its
-- #SBATCH --signal lines, "%XX"-encoded (%, control and non-ASCII bytes) and joined by
-- %0A after the tag. The prolog then asks slurmctld for no batch script. The job's own
-- --extra is left alone (the prolog then reads the script). A user can rewrite Extra
-- (scontrol update): the prolog parses it with the same rules and bounds as a script,
-- as the user input it is (wrapper/slurm/context.py).
local EXTRA_TAG = "jobwrap:1"
local EXTRA_MOST = 4096

local function percent(c)
    return string.format("%%%02X", c:byte())
end

local function extra_is_ours(job_desc)
    local current = job_desc.extra
    return current == nil or current == "" or starts_with(current, EXTRA_TAG)
end

-- added: directive lines the site adds (its default spare nodes), kept after the job's.
local function store_directives(job_desc, header, added)
    if not extra_is_ours(job_desc) then
        return "left: the job's own --extra"
    end
    local kept = {}
    for _, item in ipairs(header) do
        local line = item[2]
        local after = line:sub(#PREFIX + 1, #PREFIX + 1)
        local ours = starts_with(line, PREFIX) and (after == "" or after:find(WS) ~= nil)
        if ours or (starts_with(line, "#SBATCH") and line:find("--signal", 1, true)) then
            kept[#kept + 1] = (line:gsub("[%%%c\128-\255]", percent))
        end
    end
    for _, line in ipairs(added or {}) do
        kept[#kept + 1] = line
    end
    local text = EXTRA_TAG .. " " .. table.concat(kept, "%0A")
    if #text > EXTRA_MOST then
        job_desc.extra = "" -- too long: the prolog reads the script
        return "too long; the prolog reads the script"
    end
    job_desc.extra = text
    return "stored"
end

-- Whether an #SBATCH line of the header says --no-kill (-k): a node Slurm loses then
-- leaves the job running on the others, so a spare can take its place.
local function sbatch_no_kill(header)
    for _, line in ipairs(header_lines(header, "#SBATCH")) do
        for _, word in ipairs(shell_words(line[2]) or {}) do
            if word == "--no-kill" or word == "-k" or starts_with(word, "--no-kill=") then
                return true
            end
        end
    end
    return false
end

-- The partitions the job may run in: the ones it names, else the default one.
local function job_partitions(job_desc, part_list)
    local names = {}
    local asked = job_desc.partition
    if asked ~= nil and asked ~= "" then
        for name in asked:gmatch("[^,]+") do
            names[#names + 1] = name
        end
        return names
    end
    for name, part in pairs(part_list or {}) do
        local flags = part.flags
        if flags ~= nil and flags % 2 == 1 then -- PART_FLAG_DEFAULT
            names[#names + 1] = name
        end
    end
    return names
end

-- SITE.spare_nodes for the job's (first) partition; 0 when the site sets none.
local function site_spares(names)
    local site = SITE.spare_nodes or ""
    for item in site:gmatch("[^,]+") do
        local part, count = item:match("^%s*([^=%s]+)%s*=%s*(%d+)%s*$")
        if part ~= nil and part == names[1] and #count <= MAX_NUMBER_DIGITS then
            return tonumber(count)
        end
    end
    return 0
end

local function is_set32(value)
    return value ~= nil and value ~= 0 and value ~= slurm.NO_VAL and value ~= slurm.INFINITE
end

-- Add the job's spare nodes to its node count; nil, or the reason it cannot have them.
local function add_spares(job_desc, part_list, spares, where)
    local base, most = job_desc.min_nodes, job_desc.max_nodes
    if not is_set32(base) or (is_set32(most) and most ~= base) then
        return string.format("%s: --spare-nodes=%d needs a fixed node count: add "
            .. "#SBATCH --nodes=N (the nodes the job works on; the spares come on top)",
            where, spares)
    end
    local total = base + spares
    for _, name in ipairs(job_partitions(job_desc, part_list)) do
        local part = part_list and part_list[name]
        if part ~= nil then
            local size, cap = part.total_nodes, part.max_nodes
            if size ~= nil and total > size then
                return string.format("%s: --spare-nodes=%d: %d nodes and %d spares do not "
                    .. "fit in partition %s, which has %d nodes; ask fewer spares", where,
                    spares, base, spares, name, size)
            end
            if is_set32(cap) and total > cap then
                return string.format("%s: --spare-nodes=%d: %d nodes and %d spares are more "
                    .. "than partition %s allows a job (MaxNodes=%d); ask fewer spares",
                    where, spares, base, spares, name, cap)
            end
        end
    end
    local tasks = job_desc.num_tasks
    if is_set32(tasks) then
        if tasks % base ~= 0 then
            return string.format("%s: --spare-nodes=%d: %d tasks do not spread evenly over "
                .. "%d nodes; use #SBATCH --ntasks-per-node", where, spares, tasks, base)
        end
        job_desc.num_tasks = math.floor(tasks / base) * total
    end
    job_desc.min_nodes = total
    job_desc.max_nodes = total
    return nil
end

-- In-allocation restarts without a change to the script ([restart] batch_wrapper). One
-- line goes in where the script's header ends (its #! line, comments and blank lines, so
-- that every reader of #SBATCH and #JOBWRAP lines reads what it did); run by the batch
-- step, it execs `jobwrap run -- INTERPRETER "$0" "$@"`, which runs the same script again,
-- where the line's test (jobwrap run exports JOBWRAP_RUN=$SLURM_JOB_ID) lets it pass.
-- A node without the command runs the script as it was. Only scripts of a POSIX shell
-- (sh, bash, dash, ksh, zsh: the line is theirs), and never one that already calls
-- `jobwrap run`. wrapper/restart/batch.py takes the line out again (archive, rerun).
local WRAP_MARK = "# jobwrap: restarts inside the allocation (job_submit.lua)"
local WRAP_SHELLS = { sh = true, bash = true, dash = true, ksh = true, zsh = true }
local SAFE_WORD = "^[%w%./_+=,:@-]+$"

local function quoted(word)
    return "'" .. word .. "'" -- SAFE_WORD has no quote
end

-- The #! line's words when they name a shell of WRAP_SHELLS (directly, or through env).
local function shell_of(first_line)
    if not starts_with(first_line, "#!") then
        return nil, "no #! line"
    end
    local words = {}
    for word in first_line:sub(3):gmatch(NOT_WS .. "+") do
        if not word:find(SAFE_WORD) or #words >= 4 then
            return nil, "its #! line is not a plain command"
        end
        words[#words + 1] = word
    end
    local program = words[1] or ""
    local name = program:match("([^/]*)$")
    if name == "env" then
        name = words[2] or ""
    end
    if program:sub(1, 1) ~= "/" or not WRAP_SHELLS[name] then
        return nil, "its #! line names no POSIX shell"
    end
    return words
end

-- The script with the line in, or nil and why it is left as it is.
local function wrap_batch(script)
    if SITE.batch_wrapper == "" then
        return nil, "off"
    end
    if script:find(WRAP_MARK, 1, true) or script:find("jobwrap run", 1, true) then
        return nil, "it runs jobwrap run itself"
    end
    local first_end = script:find("\n", 1, true)
    if first_end == nil then
        return nil, "one line"
    end
    local words, why = shell_of(script:sub(1, first_end - 1))
    if words == nil then
        return nil, why
    end
    -- the header ends at the first line that is neither blank nor a comment
    local at = first_end + 1
    while at <= #script do
        local stop = script:find("\n", at, true) or (#script + 1)
        local line = strip(script:sub(at, stop - 1))
        if line ~= "" and line:sub(1, 1) ~= "#" then
            break
        end
        at = stop + 1
    end
    if at > #script then
        return nil, "no command"
    end
    if script:sub(1, at - 1):find("[\r\v\f\28\29\30]") then
        return nil, "its header has line breaks other than newlines"
    end
    local interpreter = {}
    for i, word in ipairs(words) do
        interpreter[i] = quoted(word)
    end
    local command = quoted(SITE.batch_wrapper)
    local line = string.format('[ "${JOBWRAP_RUN:-}" = "${SLURM_JOB_ID:-}" ] || '
        .. '[ ! -x %s ] || exec %s run -- %s "$0" "$@"  %s', command, command,
        table.concat(interpreter, " "), WRAP_MARK)
    return script:sub(1, at - 1) .. line .. "\n" .. script:sub(at), "wrapped"
end

local function refuse(message)
    -- log_user formats its arguments like string.format: never pass text as the format.
    slurm.log_user("%s", message)
    return slurm.ERROR
end

local function submit(job_desc, part_list, submit_uid)
    local script = job_desc.script
    if script == nil then
        return slurm.SUCCESS -- srun/salloc: no batch script, nothing of ours to check
    end
    local header = read_header(script)
    local options, given = parse_script(header)
    if options == nil then
        slurm.log_info("jobwrap: refused a job of uid %s: %s", tostring(submit_uid), given)
        return refuse(given)
    end
    local restarts = options["--max-restarts"]
    local limit = SITE.max_restarts_limit
    if restarts ~= nil and limit >= 0 and restarts > limit then
        local where = given["--max-restarts"]
        return refuse(string.format("#JOBWRAP line %d: --max-restarts=%s: this cluster "
            .. "allows at most %d restarts", where[1], py_repr(where[2]), limit))
    end
    local spares, asked = options["--spare-nodes"], true
    local added = {}
    if spares == nil then
        -- The site's default reaches jobwrap as a directive in the job's Extra; where
        -- that cannot be stored (the job's own --extra) the job gets none.
        spares, asked = site_spares(job_partitions(job_desc, part_list)), false
        if not extra_is_ours(job_desc) then
            spares = 0
        end
    end
    if spares > 0 then
        local where = asked and ("#JOBWRAP line " .. given["--spare-nodes"][1])
            or "this cluster's default spare nodes"
        local problem = add_spares(job_desc, part_list, spares, where)
        if problem and asked then
            return refuse(problem)
        elseif problem then -- the site's default fits no job of this shape: none for it
            slurm.log_debug("jobwrap: job of uid %s gets no spare: %s", tostring(submit_uid),
                problem)
            spares = 0
        end
    end
    if spares > 0 then
        if not asked then
            added[1] = string.format("%s --spare-nodes=%d", PREFIX, spares)
        end
        if not sbatch_no_kill(header) then
            slurm.log_user("%s", string.format("jobwrap: %d spare node(s) held; add "
                .. "#SBATCH --no-kill so that a node Slurm loses is replaced too (without "
                .. "it only a GPU fault is)", spares))
        end
    end
    local requeue, why = decide_requeue(job_desc, options, header)
    if requeue ~= nil then
        job_desc.requeue = requeue
    end
    local signal = add_signal(job_desc)
    local stored = store_directives(job_desc, header, added)
    local wrapped, how = wrap_batch(script)
    if wrapped ~= nil then
        job_desc.script = wrapped
    end
    slurm.log_debug("jobwrap: job of uid %s: requeue=%s (%s), pre-timeout signal: %s, "
        .. "directives for the prolog: %s, batch script: %s", tostring(submit_uid),
        tostring(requeue), why, signal, stored, how)
    return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local ok, rc = pcall(submit, job_desc, part_list, submit_uid)
    if ok then
        return rc
    end
    -- A bug of ours must not stop a cluster from taking jobs: say it loudly, accept.
    slurm.log_error("jobwrap job_submit.lua: internal error, job accepted unchecked: %s",
        tostring(rc))
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    -- scontrol update never carries a batch script: nothing of ours to check.
    return slurm.SUCCESS
end

slurm.log_debug("jobwrap job_submit.lua loaded")
return slurm.SUCCESS
