"""Prompt-injection scan of untrusted page text (a text layer, OCR output, invisible text) and of
model output. Pure functions: regular expressions over normalised text, no model.

What it looks for, by category:
- `override`: "ignore (all) previous instructions" and the like, in English, German, French,
  Spanish, Italian, Portuguese, Dutch, Polish, Russian, Chinese, Japanese and Korean;
- `role`: chat-template, vision and role markers (`<|im_start|>`, `<|vision_end|>`, `[INST]`, `<<SYS>>`,
  `### System:`);
- `fence`: text shaped like the prompt's hint fence (`PAGE_TEXT>>>`, `page text >>>`), in any case or spacing;
- `addressed`: text addressed to a model ("you are now an AI", "if you are an AI", "dear LLM",
  "from now on you ...");
- `system_prompt`: requests for, or talk of, the system prompt (several languages);
- `agent_action`: requests to act on the reader's data ("check my calendar", "forward all e-mails");
- `output_override`: attempts to steer the extraction ("set the IBAN to ...").

Text is normalised first: NFKC (full-width and compatibility forms become plain letters) and the
removal of format characters (zero-width spaces and joiners, bidi controls), which otherwise split
words invisibly. Homoglyphs (a Cyrillic "о" inside "ignore") are not folded: a known gap.
A regex scan is a tripwire, not a guarantee; the prompt still fences every hint and tells the model
that it is data.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_F = re.IGNORECASE | re.UNICODE | re.MULTILINE
# Shapes of control text, shared with the prompt builder (transforms/model/prompt.py), which removes them:
# a chat or vision control token (`<|im_start|>`, `<|vision_end|>`, `<|video_pad|>` ...), and anything
# that looks like the hint fence (`PAGE_TEXT>>>`, `page text >>>`, `<<<PAGE_TEXT-...`), matched after
# normalisation, in any case and spacing.
CONTROL_TOKEN = re.compile(r"<\|[^<>|\n]{0,64}\|>|</?(?:tool_call|tool_response|think)>|\[/?INST\]|<</?SYS>>")
FENCE_MARKER = re.compile(r"<{2,}\s*page[\s_\-]*text[\w\-]*|page[\s_\-]*text[\w\-]*\s*>{2,}", _F)
_ART = r"(?:(?:all|any|the|your|my|of|these|those)\s+)*"
_PRIOR = r"(?:previous|prior|above|preceding|earlier|former|original|initial|system|old)"
_ORDERS = r"(?:instructions?|prompts?|rules|directions|directives|guidelines|context|messages?|commands?|orders)"
_AI = (r"(?:ai|a\.i\.|llm|language\s+model|large\s+language\s+model|assistant|chat\s*bot|chatgpt|gpt|claude|gemini|"
       r"copilot|bot)")

PATTERNS: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple((c, lang, re.compile(p, _F)) for c, lang, p in (
    ("override", "en", rf"\b(?:ignore|disregard|forget|skip|override|bypass|neglect)\s+{_ART}{_PRIOR}\s+{_ORDERS}"),
    ("override", "en", r"\b(?:ignore|disregard|forget)\s+(?:everything|all)\s+(?:you\s+(?:were|have\s+been)\s+told"
                       r"|above|before|previously|so\s+far)"),
    ("override", "en", rf"\b(?:do\s+not|don'?t|never)\s+follow\s+{_ART}{_PRIOR}\s+{_ORDERS}"),
    ("override", "en", r"\bnew\s+(?:instructions|rules|task|system\s+prompt)\s*:"),
    ("override", "de", r"\b(?:ignorier(?:e|en\s+sie)?|vergiss|vergessen\s+sie|missachte(?:n\s+sie)?)\s+"
                       r"(?:(?:alle|die|deine|ihre|sämtliche)\s+)*(?:vorherigen|bisherigen|obigen|vorigen|früheren|"
                       r"ursprünglichen)\s+(?:anweisungen|instruktionen|befehle|regeln|anordnungen|vorgaben)"),
    ("override", "de", r"\bneue\s+anweisungen\s*:"),
    ("override", "fr", r"\b(?:ignore[rsz]?|oublie[rsz]?)\s+(?:(?:toutes|tous|les|vos|tes|des)\s+)*(?:instructions|"
                       r"consignes|directives|règles)\s+(?:précédentes|antérieures|ci-dessus|initiales)"),
    ("override", "es", r"\b(?:ignora|ignore|ignorad|ignoren|olvida|olvide)\s+(?:(?:todas|las|tus|sus)\s+)*"
                       r"(?:instrucciones|indicaciones|órdenes|reglas)\s+(?:anteriores|previas|de\s+arriba)"),
    ("override", "it", r"\b(?:ignora|ignorate|ignori|dimentica)\s+(?:(?:tutte|le|tue)\s+)*(?:istruzioni|"
                       r"indicazioni|regole)\s+(?:precedenti|di\s+sopra|iniziali)"),
    ("override", "pt", r"\b(?:ignore|ignora|ignorem|esqueça|esqueca)\s+(?:(?:todas|as|suas)\s+)*(?:instruções|"
                       r"instrucoes|orientações|regras)\s+(?:anteriores|acima|iniciais)"),
    ("override", "nl", r"\b(?:negeer|vergeet)\s+(?:(?:alle|de|je)\s+)*(?:vorige|eerdere|voorgaande|bovenstaande)\s+"
                       r"(?:instructies|opdrachten|regels)"),
    ("override", "pl", r"\b(?:zignoruj|ignoruj|zapomnij)\s+(?:wszystkie\s+)?(?:poprzednie|wcześniejsze|powyższe)\s+"
                       r"(?:instrukcje|polecenia)"),
    ("override", "ru", r"(?:игнорируй|проигнорируй|игнорируйте|забудь|забудьте)\s+(?:все\s+)?(?:предыдущие|прошлые|"
                       r"вышеуказанные|прежние)\s+(?:инструкции|указания|команды)"),
    ("override", "zh", r"(?:忽略|无视|忽视|忘记|忘掉)(?:之前|以上|先前|上面|前面|所有)(?:的)?"
                       r"(?:所有)?(?:指令|指示|说明|规则|提示)"),
    ("override", "ja", r"(?:以前|これまで|上記|前)の(?:指示|命令|指令|ルール)を(?:無視|忘れ)"),
    ("override", "ko", r"(?:이전|위의|앞의)\s*(?:모든\s*)?(?:지시|명령|지침)(?:을|를|사항을)?\s*(?:무시|잊)"),
    ("role", "any", r"<\|\s*(?:im_start|im_end|system|assistant|user|endoftext|eot_id|start_header_id|"
                    r"end_header_id|begin_of_text)\s*\|>"),
    ("role", "any", r"<\|\s*(?:vision|image|video|box|quad|object_ref|fim)_[a-z_]{1,20}\s*\|>"),
    ("fence", "any", FENCE_MARKER.pattern),
    ("role", "any", r"\[/?INST\]|<</?SYS>>|</?s>\s*\[INST\]"),
    ("role", "any", r"^\s*#{2,}\s*(?:system|instruction|instructions|assistant)\s*:?\s*$"),
    ("role", "en", r"^\s*(?:system|assistant)\s*:\s*(?:you|ignore|from\s+now|new\s+instructions)"),
    ("addressed", "en", rf"\byou\s+are\s+(?:now\s+)?(?:an?\s+|the\s+)?{_AI}\b"),
    ("addressed", "en", rf"\bif\s+you\s+are\s+(?:an?\s+)?{_AI}\b"),
    ("addressed", "en", rf"\b(?:dear|attention|hey|note\s+to\s+(?:the\s+)?|message\s+(?:to|for)\s+(?:the\s+)?){_AI}\b"),
    ("addressed", "en", rf"\b{_AI}s?\s+(?:reading|processing|parsing|extracting|summari[sz]ing)\s+this\b"),
    ("addressed", "en", r"\bfrom\s+now\s+on,?\s+you\s+(?:are|will|must|shall)\b"),
    ("addressed", "de", rf"\bdu\s+bist\s+(?:jetzt\s+)?(?:ein(?:e)?\s+)?(?:ki|{_AI})\b"),
    ("addressed", "fr", r"\btu\s+es\s+(?:maintenant\s+)?(?:une?\s+)?(?:ia|assistant|modèle\s+de\s+langage)\b"),
    ("addressed", "es", r"\b(?:eres|ahora\s+eres)\s+(?:una?\s+)?(?:ia|asistente|modelo\s+de\s+lenguaje)\b"),
    ("system_prompt", "en", r"\b(?:reveal|print|show|repeat|output|display|tell\s+me|leak|dump|give\s+me|what\s+is)\s+"
                            r"(?:me\s+)?(?:your|the)\s+(?:system\s+prompt|initial\s+prompt|hidden\s+prompt|"
                            r"system\s+message|instructions\s+above|original\s+instructions)\b"),
    ("system_prompt", "any", r"\bsystem[\s-]?prompt\b|\bprompt\s+(?:système|systeme|del\s+sistema|di\s+sistema|"
                             r"do\s+sistema)\b|\bsystemanweisung(?:en)?\b|系统提示|システムプロンプト"),
    ("agent_action", "en", r"\b(?:check|read|open|search|access|forward|export|summari[sz]e|list|delete)\s+"
                           r"(?:(?:all|of|my|the\s+user'?s|your\s+user'?s)\s+)+(?:calendar|inbox|e-?mails?|contacts|"
                           r"files|passwords?|credentials|messages|chats?|history)\b"),
    ("output_override", "en", r"\b(?:set|change|replace|overwrite)\s+(?:the\s+)?(?:total|amount\s+due|iban|"
                              r"account\s+number|bank\s+details|payee|beneficiary)\s+(?:to|with)\b"),
))


@dataclass(frozen=True)
class InjectionMatch:
    category: str
    lang: str
    snippet: str  # the matched text (normalised), at most 80 characters
    start: int  # offsets into normalise(text)
    end: int

    def describe(self) -> str:
        return f"{self.category}/{self.lang}: {self.snippet!r}"


def normalise(text: str) -> str:
    """NFKC, without format characters (zero-width spaces and joiners, bidi controls)."""
    if text.isascii():  # NFKC leaves ASCII as it is and no ASCII character is a format character
        return text
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


def scan(text: str) -> tuple[InjectionMatch, ...]:
    """Every match, in text order. The offsets refer to `normalise(text)`."""
    norm = normalise(text)
    found = [InjectionMatch(cat, lang, m.group(0)[:80], m.start(), m.end())
             for cat, lang, pattern in PATTERNS for m in pattern.finditer(norm) if m.group(0).strip()]
    return tuple(sorted(found, key=lambda m: (m.start, m.end)))


def neutralise(text: str, matches: tuple[InjectionMatch, ...] | None = None) -> str:
    """The normalised text with every match replaced by `[removed]`."""
    norm = normalise(text)
    matches = scan(text) if matches is None else matches
    out, pos = [], 0
    for m in matches:
        if m.start < pos:  # overlaps a match already removed
            pos = max(pos, m.end)
            continue
        out.append(norm[pos: m.start])
        out.append("[removed]")
        pos = m.end
    out.append(norm[pos:])
    return "".join(out)
