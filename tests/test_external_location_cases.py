"""Cases of corpus/cases/external/payloads.toml on how a location and its numbers are spelled, written where the
payload shard of the mutation run (docs/audit/mutation.md) found the oracle's code reached by no case: a file name
with a space, an empty component, the directory named as './.', a lowercase drive letter, a zero-padded length and
a length of forty digits. The reference passes each case, and each fails a runtime with one plausible bug, written
here as a small fault."""

from __future__ import annotations

import functools
import re
from dataclasses import replace

from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl import payload
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

_SPACE = "Required.External.Affine.SpaceInLocation"
_DOUBLE_SLASH = "Recommended.External.Affine.DoubleSlashInLocation"
_ZERO_PADDED = "Recommended.External.Affine.ZeroPaddedLength"
_FORTY_DIGITS = "Required.External.Keys.LengthOfFortyDigits"
_DIRECTORY_TWICE = "Recommended.External.PathSafety.CurrentDirectoryTwice"
_LOWERCASE_DRIVE = "Recommended.External.PathSafety.WindowsDriveLowercase"


@functools.cache
def _cases() -> dict:
    wanted = {_SPACE, _DOUBLE_SLASH, _ZERO_PADDED, _FORTY_DIGITS, _DIRECTORY_TWICE, _LOWERCASE_DRIVE}
    return {case.id: case for case in load_cases() if case.id in wanted}


class LocationEndsAtSpace(Fault):
    """Reads the location as a C runtime scanning it with "%s" does: up to the first space."""

    fault_id = "PAY-EXTERNAL-EXTENT.location-ends-at-space"

    def patches(self):
        def make(original):
            def open_external(extent, base_dir, path):
                return original(replace(extent, location=extent.location.split(" ")[0]), base_dir, path)
            return open_external
        return [wrap(payload, "open_external", make)]


class EmptyComponentOpened(Fault):
    """Splits the location on '/' and opens every piece, the empty one between two slashes too (which fails)."""

    fault_id = "PAY-EXTERNAL-EXTENT.empty-component-opened"

    def patches(self):
        def make(original):
            def open_external(extent, base_dir, path):
                if "//" in extent.location.replace("\\", "/"):
                    raise violation(E.EXTERNAL_FILE_INVALID, path, "no file named '' in the directory")
                return original(extent, base_dir, path)
            return open_external
        return [wrap(payload, "open_external", make)]


class DigitsCountedWithZeros(Fault):
    """Refuses a number of more than 20 characters before stripping its leading zeros."""

    fault_id = "PAY-EXTERNAL-KEYS.digits-counted-with-zeros"

    def patches(self):
        def make(original):
            def decimal(text, path):
                if isinstance(text, str) and len(text) > 20:
                    raise violation(E.EXTERNAL_NUMBER_INVALID, path, "more than 20 digits")
                return original(text, path)
            return decimal
        return [wrap(payload, "_decimal", make)]


class DecimalWrapsAt64Bits(Fault):
    """Accumulates the digits in a 64-bit unsigned integer without an overflow check, so 2**64 * k + 4 reads as 4."""

    fault_id = "PAY-EXTERNAL-KEYS.decimal-wraps-at-64-bits"

    def patches(self):
        def make(original):
            def decimal(text, path):
                if not (isinstance(text, str) and re.fullmatch(r"[0-9]+", text)):
                    return original(text, path)
                value = 0
                for digit in text:
                    value = (value * 10 + int(digit)) % (1 << 64)
                return value
            return decimal
        return [wrap(payload, "_decimal", make)]


class DirectoryItselfOpened(Fault):
    """Refuses only the spellings '.' and './' of the model directory: './.' is opened, and the directory is not a
    regular file."""

    fault_id = "PAY-EXTERNAL-CONTAINED.directory-itself-opened"

    def patches(self):
        def make(original):
            def open_external(extent, base_dir, path):
                if not [part for part in extent.location.replace("\\", "/").split("/") if part not in ("", ".")]:
                    raise violation(E.EXTERNAL_FILE_INVALID, path, "the backing file is not a regular file")
                return original(extent, base_dir, path)
            return open_external
        return [wrap(payload, "open_external", make)]


class UppercaseDriveOnly(Fault):
    """Recognizes a drive letter only in upper case: 'c:\\w.bin' is taken as a relative path and opened."""

    fault_id = "PAY-EXTERNAL-CONTAINED.uppercase-drive-only"

    def patches(self):
        def make(original):
            def check_location(location, path):
                if isinstance(location, str) and re.match(r"^[a-z]:", location):
                    return None
                return original(location, path)
            return check_location
        return [wrap(payload, "check_location", make)]


CATCHERS = [
    (LocationEndsAtSpace(), (_SPACE,)),
    (EmptyComponentOpened(), (_DOUBLE_SLASH,)),
    (DigitsCountedWithZeros(), (_ZERO_PADDED,)),
    (DecimalWrapsAt64Bits(), (_FORTY_DIGITS,)),
    (DirectoryItselfOpened(), (_DIRECTORY_TWICE,)),
    (UppercaseDriveOnly(), (_LOWERCASE_DRIVE,)),
]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 6, CATCHERS)
