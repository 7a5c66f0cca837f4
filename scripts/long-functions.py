#!/usr/bin/env python3
"""Lists the Rust functions longer than a limit, `#[cfg(test)]` modules left out.

    scripts/long-functions.py [--limit=80] PATH...

PATH is a file or a directory (searched for *.rs). Prints `file:line: name
N lines` for each function over the limit (80 lines by default) and exits 1
when there is any. Braces in strings, chars and comments are skipped.
"""
import re, sys, pathlib
limit = 80
paths = []
for a in sys.argv[1:]:
    if a.startswith('--limit='):
        limit = int(a.split('=')[1]); continue
    p = pathlib.Path(a)
    paths += sorted(p.rglob('*.rs')) if p.is_dir() else [p]
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')
def strip(line, state):
    # remove strings/comments roughly; state tracks block comments and raw strings
    out = []; i = 0; n = len(line)
    while i < n:
        if state['block']:
            j = line.find('*/', i)
            if j < 0: return ''.join(out)
            state['block'] = False; i = j + 2; continue
        if state['str']:
            j = i
            while j < n:
                if line[j] == '\\': j += 2; continue
                if line[j] == '"' : break
                j += 1
            if j >= n: return ''.join(out)
            state['str'] = False; i = j + 1; continue
        if state['raw'] is not None:
            end = '"' + '#' * state['raw']
            j = line.find(end, i)
            if j < 0: return ''.join(out)
            i = j + len(end); state['raw'] = None; continue
        c = line[i]
        if line.startswith('//', i): break
        if line.startswith('/*', i): state['block'] = True; i += 2; continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i-1].isalnum() or line[i-1] == '_')):
            state['raw'] = len(m.group(1)); i += m.end(); continue
        if c == '"': state['str'] = True; i += 1; continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", line[i:]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", line[i:])
            if m: i += m.end(); continue
        out.append(c); i += 1
    return ''.join(out)
found = 0
for path in paths:
    lines = path.read_text().splitlines()
    state = {'block': False, 'str': False, 'raw': None}
    depth = 0; stack = []; test_depth = None; pending_test = False
    for no, raw in enumerate(lines, 1):
        code = strip(raw, state)
        if re.match(r'\s*#\[cfg\(test\)\]', raw): pending_test = True
        m = fn_re.match(code)
        if m and test_depth is None:
            stack.append([m.group(7), no, None])
        for ch in code:
            if ch == '{':
                depth += 1
                if pending_test and test_depth is None: test_depth = depth; pending_test = False
                for f in stack:
                    if f[2] is None: f[2] = depth
            elif ch == '}':
                if test_depth == depth: test_depth = None
                while stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    length = no - start + 1
                    if length > limit:
                        print(f'{path}:{start}: {name} {length} lines'); found += 1
                depth -= 1
        if ';' in code and stack and stack[-1][2] is None and code.rstrip().endswith(';'):
            stack.pop()  # declaration without a body (trait method)
        if pending_test and re.match(r'\s*(pub\s+)?mod\s+\w+\s*;', code): pending_test = False
sys.exit(1 if found else 0)
