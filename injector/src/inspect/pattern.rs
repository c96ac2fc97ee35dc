//! Function patterns: `[MODULE:]NAME` with shell-style globs, and "did you
//! mean" suggestions.

use std::fmt;

pub use super::error::PatternError;
use super::module::Module;
use super::names::{scope_tails, source_names, SourceNames};

/// One element of a compiled glob.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// A literal character.
    Char(char),
    /// `?`: any one character.
    Any,
    /// `*`: any run of characters, including none.
    Star,
    /// `[...]`: one character in (or, if negated, not in) the ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    fn matches(&self, c: char) -> bool {
        match self {
            Token::Char(x) => *x == c,
            Token::Any => true,
            Token::Star => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
        }
    }
}

/// A compiled shell-style glob: `*`, `?`, `[abc]`, `[a-z]`, `[!a]` / `[^a]`,
/// and `\` to escape the next character.
///
/// Matching is `O(len(glob) * len(text))` in the worst case (the classic
/// single-backtrack-point algorithm), never exponential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    text: String,
    tokens: Vec<Token>,
    /// The unescaped text when the glob has no wildcard: matched by `==`.
    literal: Option<String>,
}

impl Glob {
    /// Compiles `text`.
    pub fn new(text: &str) -> Result<Glob, PatternError> {
        let mut tokens = Vec::new();
        let mut chars = text.chars().peekable();
        let mut literal = true;
        while let Some(c) = chars.next() {
            let tok = match c {
                '\\' => Token::Char(
                    chars
                        .next()
                        .ok_or_else(|| PatternError::TrailingEscape(text.into()))?,
                ),
                '?' => Token::Any,
                '*' => {
                    // `**` is `*`; collapsing keeps the matcher's work bound.
                    if tokens.last() == Some(&Token::Star) {
                        continue;
                    }
                    Token::Star
                }
                '[' => {
                    let negated = matches!(chars.peek(), Some('!' | '^'));
                    if negated {
                        chars.next();
                    }
                    let mut ranges = Vec::new();
                    let mut first = true;
                    loop {
                        let c = chars
                            .next()
                            .ok_or_else(|| PatternError::UnclosedClass(text.into()))?;
                        // A `]` right after `[` or `[!` is a literal, as in sh.
                        if c == ']' && !first {
                            break;
                        }
                        first = false;
                        let c = if c == '\\' {
                            chars
                                .next()
                                .ok_or_else(|| PatternError::UnclosedClass(text.into()))?
                        } else {
                            c
                        };
                        let mut lookahead = chars.clone();
                        if lookahead.next() == Some('-')
                            && lookahead.peek().is_some_and(|&e| e != ']')
                        {
                            chars.next();
                            let hi = chars
                                .next()
                                .ok_or_else(|| PatternError::UnclosedClass(text.into()))?;
                            ranges.push((c.min(hi), c.max(hi)));
                        } else {
                            ranges.push((c, c));
                        }
                    }
                    Token::Class { negated, ranges }
                }
                c => Token::Char(c),
            };
            if !matches!(tok, Token::Char(_)) {
                literal = false;
            }
            tokens.push(tok);
        }
        let literal = literal.then(|| {
            tokens
                .iter()
                .map(|t| match t {
                    Token::Char(c) => *c,
                    _ => unreachable!("literal globs hold only Char tokens"),
                })
                .collect()
        });
        Ok(Glob {
            text: text.into(),
            tokens,
            literal,
        })
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the glob has no wildcard (it then matches one exact string).
    pub fn is_literal(&self) -> bool {
        self.literal.is_some()
    }

    /// The exact string a wildcard-free glob matches.
    pub fn literal(&self) -> Option<&str> {
        self.literal.as_deref()
    }

    /// Whether the whole of `s` matches.
    pub fn matches(&self, s: &str) -> bool {
        if let Some(lit) = &self.literal {
            return lit == s;
        }
        let toks = &self.tokens;
        let (mut t, mut i) = (0usize, 0usize);
        // Where to resume after the last `*`: token index after it and the
        // text position it currently swallows up to.
        let mut backtrack: Option<(usize, usize)> = None;
        loop {
            let c = s[i..].chars().next();
            match (toks.get(t), c) {
                (Some(Token::Star), _) => {
                    t += 1;
                    backtrack = Some((t, i));
                }
                (Some(tok), Some(c)) if tok.matches(c) => {
                    t += 1;
                    i += c.len_utf8();
                }
                (None, None) => return true,
                _ => {
                    // Mismatch: let the last `*` swallow one more character.
                    // Earlier stars never need revisiting, so this is linear
                    // per star position and never exponential.
                    let Some((bt, bi)) = backtrack else {
                        return false;
                    };
                    let Some(c) = s[bi..].chars().next() else {
                        return false;
                    };
                    let bi = bi + c.len_utf8();
                    backtrack = Some((bt, bi));
                    t = bt;
                    i = bi;
                }
            }
        }
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A function pattern: an optional module glob and a function-name glob.
///
/// Syntax: `NAME` or `MODULE:NAME`. The module part is split at the first
/// single `:` (a `::` belongs to a C++ name). It matches a module whose file
/// name (`libc.so.6`), full path (`/usr/lib/x86_64-linux-gnu/libc.so.6`),
/// soname (`libevent-2.1.so.7` for `libevent-2.1.so.7.0.1`) or, for the main
/// executable, `exe` or the name it was started as (`redis-server` through a
/// symlink to `redis-check-rdb`) matches, or one of these names without its
/// version suffix (`libc.so`, `libc`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    module: Option<Glob>,
    name: Glob,
    /// Whether the name part has a parameter list, to be matched against
    /// demangled names with theirs.
    with_params: bool,
}

/// The patterns of a comma-separated list (`-f a,b`): split at each comma
/// outside parentheses, angle and square brackets, so that
/// `ns::f(int, int)`, `max_of<int, 2>` and `f[,.]` stay whole.
pub fn split_list(spec: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, b) in spec.bytes().enumerate() {
        match b {
            b'(' | b'<' | b'[' => depth += 1,
            b')' | b'>' | b']' => depth -= 1,
            b',' if depth <= 0 => {
                out.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&spec[start..]);
    out
}

/// Finds the first `:` that is not part of a `::`.
fn module_separator(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    (0..b.len())
        .find(|&i| b[i] == b':' && (i == 0 || b[i - 1] != b':') && b.get(i + 1) != Some(&b':'))
}

impl Pattern {
    /// Parses `[MODULE:]NAME`.
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(PatternError::Empty);
        }
        let (module, name) = match module_separator(trimmed) {
            Some(i) => (Some(&trimmed[..i]), &trimmed[i + 1..]),
            None => (None, trimmed),
        };
        if name.is_empty() || module.is_some_and(str::is_empty) {
            return Err(PatternError::EmptyPart(trimmed.into()));
        }
        Ok(Pattern {
            text: trimmed.into(),
            module: module.map(Glob::new).transpose()?,
            name: Glob::new(name)?,
            with_params: name.replace("(anonymous namespace)", "").contains('('),
        })
    }

    /// The pattern as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The module glob, if the pattern has a `MODULE:` part.
    pub fn module(&self) -> Option<&Glob> {
        self.module.as_ref()
    }

    /// The function-name glob.
    pub fn name(&self) -> &Glob {
        &self.name
    }

    /// Whether a module with this file name and path is selected.
    pub fn matches_module_name(&self, file_name: &str, path: &str) -> bool {
        self.matches_module_names(path, [file_name])
    }

    /// Whether a module at `path` answering to any of `names` (its file
    /// name, its soname, the name it was started as, `exe`, see
    /// [`Module::names`]) is selected. Each name also answers without its
    /// `.so` version suffix.
    pub fn matches_module_names<'a>(
        &self,
        path: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> bool {
        let Some(g) = &self.module else {
            return true;
        };
        g.matches(path) || names.into_iter().any(|n| name_matches(g, n))
    }

    /// Whether this pattern can select functions of `module`, so that only
    /// such modules need their symbols parsed.
    pub fn could_match_module(&self, module: &Module) -> bool {
        self.matches_module_names(&module.path().to_string_lossy(), module.names())
    }

    /// Whether a function with linkage name `name` is selected (module not
    /// checked): by that name, or by its source names (see
    /// [`Pattern::matches_names`]), worked out here.
    pub fn matches_function(&self, name: &str) -> bool {
        self.name.matches(name)
            || (self.may_match_source_of(name)
                && self.matches_names(name, source_names(name).as_ref()))
    }

    /// Whether the source names of a function with linkage name `linkage`
    /// could match at all, told without demangling it: a pattern that is
    /// one plain identifier (`dispatch_command`, `malloc`) matches a clone's
    /// source name or a demangled name's last component, and both are
    /// spelt out in the linkage name. Spares demangling a whole C++
    /// library to look for `malloc`.
    pub fn may_match_source_of(&self, linkage: &str) -> bool {
        match self.name.literal() {
            Some(lit) if lit.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                linkage.contains(lit)
            }
            _ => true,
        }
    }

    /// Whether a function with linkage name `linkage` and source names
    /// `source` ([`source_names`] of it, cached by
    /// [`ElfImage::source_names`](super::ElfImage::source_names)) is
    /// selected, module not checked. The name part matches:
    ///
    /// * the linkage name as is (`parse_field.isra.0`, `_ZN5Cache3getEi`);
    /// * the source name of a compiler's clone (`parse_field`);
    /// * a C++ or Rust name demangled, without its parameter list when the
    ///   pattern has no `(` (`Cache::get`, `ns::Class::*`), with it when it
    ///   has one (`Cache::get(int) const`, as c++filt prints it); leading
    ///   scopes may be left out (`Cache::*` also selects
    ///   `app::Cache::get`, as in gdb).
    pub fn matches_names(&self, linkage: &str, source: Option<&SourceNames>) -> bool {
        if self.name.matches(linkage) {
            return true;
        }
        let Some(s) = source else {
            return false;
        };
        let text = if self.with_params { &s.full } else { &s.short };
        if s.scoped {
            scope_tails(text).any(|t| self.name.matches(t))
        } else {
            self.name.matches(text)
        }
    }
}

/// Whether module name `name` matches `g`: as is or, for a name like
/// `libc.so.6`, as `libc.so` and `libc` (`libfoo-1.2.so` as `libfoo-1.2`).
/// A name may be a path (`./bin/tool`, how a program was started).
fn name_matches(g: &Glob, name: &str) -> bool {
    if g.matches(name) {
        return true;
    }
    let file_name = name.rsplit('/').next().unwrap_or(name);
    if file_name != name && g.matches(file_name) {
        return true;
    }
    // `.so` in the middle of a name (`lib.sox`) is not a version suffix.
    if let Some(i) = file_name.find(".so") {
        let rest = &file_name[i + 3..];
        if rest.is_empty() || rest.starts_with('.') {
            return g.matches(&file_name[..i]) || g.matches(&file_name[..i + 3]);
        }
    }
    false
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Pattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::parse(s)
    }
}

/// Levenshtein distance, or `None` as soon as it must exceed `max`.
fn edit_distance(a: &[char], b: &[char], max: usize) -> Option<usize> {
    if a.len().abs_diff(b.len()) > max {
        return None;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        let mut row_min = cur[0];
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
            row_min = row_min.min(cur[j + 1]);
        }
        if row_min > max {
            return None;
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    Some(prev[b.len()]).filter(|&d| d <= max)
}

/// Up to 5 names among `candidates` that look like `name`, best first: small
/// edit distance (at most a third of the length, at least 2), or containing
/// `name` (or contained in it) when `name` has at least 3 characters.
/// Duplicates and `name` itself are skipped. Meant for "no function matches
/// `wrok_a`; did you mean `work_a`?"; `name` may be a glob, whose wildcard
/// characters are then ignored.
pub fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    let needle: String = name
        .chars()
        .filter(|c| !matches!(c, '*' | '?' | '[' | ']'))
        .collect();
    let n: Vec<char> = needle.to_lowercase().chars().collect();
    if n.is_empty() {
        return Vec::new();
    }
    let max = (n.len() / 3).max(2);
    let needle_lower: String = n.iter().collect();
    let mut scored: Vec<(usize, usize, String)> = Vec::new();
    let mut buf: Vec<char> = Vec::new();
    for c in candidates {
        if c == name {
            continue;
        }
        let lower = c.to_lowercase();
        buf.clear();
        buf.extend(lower.chars());
        let score = match edit_distance(&n, &buf, max) {
            Some(d) => Some(d),
            None => {
                let related = lower.contains(&needle_lower)
                    || (buf.len() >= 3 && needle_lower.contains(&lower));
                // Substring hits rank after every edit-distance hit, shorter
                // (closer in length) ones first.
                (n.len() >= 3 && related).then(|| max + 1 + buf.len().abs_diff(n.len()))
            }
        };
        if let Some(s) = score {
            scored.push((s, c.len(), c.to_owned()));
        }
    }
    scored.sort();
    scored.dedup_by(|a, b| a.2 == b.2);
    scored.into_iter().take(5).map(|(_, _, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(p: &str) -> Glob {
        Glob::new(p).unwrap()
    }

    #[test]
    fn globs() {
        assert!(g("work_*").matches("work_a"));
        assert!(g("work_*").matches("work_"));
        assert!(!g("work_*").matches("wor"));
        assert!(!g("work_*").matches("xwork_a"));
        assert!(g("*").matches(""));
        assert!(g("*a*b*").matches("xxaxxbxx"));
        assert!(!g("*a*b*").matches("xxbxxaxx"));
        assert!(g("bar?").matches("bar1"));
        assert!(!g("bar?").matches("bar"));
        assert!(!g("bar?").matches("bar12"));
        assert!(g("f[abc]o").matches("fbo"));
        assert!(!g("f[abc]o").matches("fdo"));
        assert!(g("f[a-c]o").matches("fco"));
        assert!(g("f[!a-c]o").matches("fdo"));
        assert!(!g("f[^a-c]o").matches("fbo"));
        assert!(g("f[]]o").matches("f]o"));
        assert!(g("f[a-]o").matches("f-o"));
        assert!(g(r"a\*b").matches("a*b"));
        assert!(!g(r"a\*b").matches("axb"));
        assert!(g(r"a\*b").is_literal());
        assert_eq!(g(r"a\*b").literal(), Some("a*b"));
        assert!(g("malloc").is_literal());
        assert!(g("malloc").matches("malloc"));
        assert!(!g("malloc").matches("malloc2"));
        assert!(g("é*ü").matches("éabcü"));
        assert!(g("?").matches("é"));
        assert!(matches!(
            Glob::new("f[ab"),
            Err(PatternError::UnclosedClass(_))
        ));
        assert!(matches!(
            Glob::new("ab\\"),
            Err(PatternError::TrailingEscape(_))
        ));
    }

    #[test]
    fn no_exponential_backtracking() {
        let text = "a".repeat(10_000);
        let pat = format!("{}b", "*a".repeat(50));
        let t = std::time::Instant::now();
        assert!(!g(&pat).matches(&text));
        assert!(g(&"*a".repeat(50)).matches(&text));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn module_qualifiers() {
        let p = Pattern::parse("libc.so.6:malloc").unwrap();
        assert_eq!(p.module().unwrap().as_str(), "libc.so.6");
        assert!(p.matches_module_name("libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!p.matches_module_name("libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6"));
        assert!(p.matches_function("malloc"));
        assert!(!p.matches_function("malloc_usable_size"));

        for m in [
            "libc",
            "libc.so",
            "libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "libc*",
            "*/libc.so.6",
        ] {
            let p = Pattern::parse(&format!("{m}:malloc")).unwrap();
            assert!(
                p.matches_module_name("libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
                "{m}"
            );
            assert!(
                !p.matches_module_name("libcrypt.so.1", "/usr/lib/x86_64-linux-gnu/libcrypt.so.1")
                    || m.contains('*'),
                "{m}"
            );
        }
        assert!(Pattern::parse("libfoo-1.2:x")
            .unwrap()
            .matches_module_name("libfoo-1.2.so", "/x/libfoo-1.2.so"));
        // `.so` in the middle of a name is not a version suffix.
        assert!(!Pattern::parse("lib:x")
            .unwrap()
            .matches_module_name("lib.sox", "/x/lib.sox"));

        let p = Pattern::parse("libfoo*:bar?").unwrap();
        assert!(p.matches_module_name("libfoo.so.1", "/x/libfoo.so.1"));
        assert!(!p.matches_module_name("libbar.so.1", "/x/libbar.so.1"));
        assert!(p.matches_function("bar1") && !p.matches_function("bar"));

        let p = Pattern::parse("work_*").unwrap();
        assert!(p.module().is_none());
        assert!(p.matches_module_name("anything", "/anything"));

        // C++ scopes are not module separators.
        let p = Pattern::parse("ns::f").unwrap();
        assert!(p.module().is_none());
        assert!(p.matches_function("ns::f"));
        let p = Pattern::parse("libx.so:ns::f*").unwrap();
        assert_eq!(p.module().unwrap().as_str(), "libx.so");
        assert!(p.matches_function("ns::foo"));

        assert_eq!(Pattern::parse("  "), Err(PatternError::Empty));
        assert!(matches!(
            Pattern::parse("libc:"),
            Err(PatternError::EmptyPart(_))
        ));
        assert!(matches!(
            Pattern::parse(":malloc"),
            Err(PatternError::EmptyPart(_))
        ));
        assert!(matches!(
            Pattern::parse("libc:[x"),
            Err(PatternError::UnclosedClass(_))
        ));
        assert_eq!("a:b".parse::<Pattern>().unwrap().to_string(), "a:b");
    }

    #[test]
    fn lists_split_outside_brackets() {
        assert_eq!(split_list("a,b"), ["a", "b"]);
        assert_eq!(
            split_list("ns::f(int, int),g<a, b>,h[,x]"),
            ["ns::f(int, int)", "g<a, b>", "h[,x]"]
        );
        assert_eq!(split_list("a,,b"), ["a", "", "b"]);
    }

    #[test]
    fn source_and_demangled_names() {
        let m = |p: &str, linkage: &str| Pattern::parse(p).unwrap().matches_function(linkage);
        // Clones by their source name, and by their own.
        assert!(m("parse_field", "parse_field.isra.0"));
        assert!(m("scale", "scale.part.0.constprop.0"));
        assert!(m("lookup*", "lookup.part.0"));
        assert!(m("parse_field.isra.0", "parse_field.isra.0"));
        assert!(!m("parse_field", "parse_field_all"));
        // A cold part is no clone.
        assert!(!m("work", "work.cold"));
        // C++: without a parameter list, with one, leading scopes left out.
        let get = "_ZNK3app5Cache3getEi";
        for p in [
            "app::Cache::get",
            "Cache::get",
            "get",
            "app::Cache::*",
            "Cache::*",
            "*::get",
            "app::Cache::get(int) const",
            "Cache::get(int)*",
            "_ZNK3app5Cache3getEi",
        ] {
            assert!(m(p, get), "{p}");
        }
        for p in [
            "Cache",
            "app::Cache::get(long)*",
            "pp::Cache::get",
            "app::get",
        ] {
            assert!(!m(p, get), "{p}");
        }
        // The quick test agrees: a plain identifier is spelt out in the
        // linkage name of everything it matches.
        for (p, linkage) in [
            ("get", get),
            ("parse_field", "parse_field.isra.0"),
            (
                "attach",
                "_ZN4weft7process7Process6attach17h0123456789abcdefE",
            ),
        ] {
            let p = Pattern::parse(p).unwrap();
            assert!(p.may_match_source_of(linkage) && p.matches_function(linkage));
        }
        assert!(!Pattern::parse("malloc").unwrap().may_match_source_of(get));
        // Templates and clones of methods.
        assert!(m(
            "app::largest<int>",
            "_ZN3app7largestIiEET_RKSt6vectorIS1_SaIS1_EE"
        ));
        assert!(m(
            "largest<*>",
            "_ZN3app7largestIdEET_RKSt6vectorIS1_SaIS1_EE"
        ));
        assert!(m(
            "Eviction::score",
            "_ZNK3app12_GLOBAL__N_18Eviction5scoreERKNS_5EntryE.constprop.0.isra.0"
        ));
        assert!(m(
            "app::(anonymous namespace)::Eviction::*",
            "_ZNK3app12_GLOBAL__N_18Eviction5scoreERKNS_5EntryE.constprop.0.isra.0"
        ));
        // Rust paths.
        assert!(m(
            "weft::process::*",
            "_ZN4weft7process7Process6attach17h0123456789abcdefE"
        ));
    }

    #[test]
    fn module_sonames_started_names_and_exe() {
        let m = |p: &str| Pattern::parse(&format!("{p}:f")).unwrap();
        // A library whose file name is not its soname.
        let lib = ["libevent-2.1.so.7.0.1", "libevent-2.1.so.7"];
        let lib_path = "/usr/lib/libevent-2.1.so.7.0.1";
        for p in [
            "libevent-2.1.so.7",
            "libevent-2.1.so.7.0.1",
            "libevent-2.1.so",
            "libevent-2.1",
            "libevent*",
        ] {
            assert!(m(p).matches_module_names(lib_path, lib), "{p}");
        }
        assert!(!m("libevent-2.1.so.7").matches_module_name(lib[0], lib_path));
        assert!(!m("libevent-2.1.so.8").matches_module_names(lib_path, lib));
        // The main executable, started through a symlink `redis-server` to
        // `redis-check-rdb`: `exe`, the path typed and its file name.
        let exe = [
            "redis-check-rdb",
            "/usr/bin/redis-server",
            "redis-server",
            "exe",
        ];
        let exe_path = "/usr/bin/redis-check-rdb";
        for p in [
            "exe",
            "redis-server",
            "/usr/bin/redis-server",
            "redis-check-rdb",
            "redis-s*",
        ] {
            assert!(m(p).matches_module_names(exe_path, exe), "{p}");
        }
        assert!(!m("redis-server").matches_module_name(exe[0], exe_path));
        assert!(!m("exe").matches_module_name(exe[0], exe_path));
        assert!(!m("redis-cli").matches_module_names(exe_path, exe));
        // A relative path typed (`./bin/tool`) answers to its file name too.
        assert!(m("tool").matches_module_names("/x/real", ["real", "./bin/tool"]));
        assert!(m("./bin/tool").matches_module_names("/x/real", ["real", "./bin/tool"]));
        // No module part: everything.
        assert!(Pattern::parse("f")
            .unwrap()
            .matches_module_names("/x", std::iter::empty()));
    }

    #[test]
    fn suggestions() {
        let names = [
            "work_a",
            "work_b",
            "main",
            "worker_loop",
            "malloc",
            "free",
            "work_a",
        ];
        let s = suggest("wrok_a", names.iter().copied());
        assert_eq!(s.first().map(String::as_str), Some("work_a"));
        assert!(s.len() <= 5);
        assert_eq!(s.iter().filter(|x| *x == "work_a").count(), 1);
        assert!(!s.contains(&"free".to_string()));
        let s = suggest("malloc", names.iter().copied());
        assert!(s.is_empty(), "{s:?}");
        let s = suggest("mallco", names.iter().copied());
        assert_eq!(s, vec!["malloc".to_string()]);
        // Substring matches.
        let s = suggest("loop", names.iter().copied());
        assert_eq!(s, vec!["worker_loop".to_string()]);
        // Globs: wildcards ignored.
        let s = suggest("wrk_*", names.iter().copied());
        assert!(s.contains(&"work_a".to_string()), "{s:?}");
        assert!(suggest("", names.iter().copied()).is_empty());
        let many: Vec<String> = (0..100).map(|i| format!("work_{i}")).collect();
        assert_eq!(suggest("work_", many.iter().map(String::as_str)).len(), 5);
    }

    #[test]
    fn edit_distances() {
        let c = |s: &str| s.chars().collect::<Vec<_>>();
        assert_eq!(edit_distance(&c("kitten"), &c("sitting"), 5), Some(3));
        assert_eq!(edit_distance(&c("kitten"), &c("sitting"), 2), None);
        assert_eq!(edit_distance(&c(""), &c("ab"), 2), Some(2));
        assert_eq!(edit_distance(&c("same"), &c("same"), 0), Some(0));
    }
}
