@echo off
rem Start N ranks of a training script on this machine:
rem   launch_distributed.bat 4 train.py --epochs 3
rem A thin wrapper over "python -m pycyxwiz.launch" (docs\launching.md). Launcher options such as
rem --master-port go in LAUNCH_ARGS; the interpreter is %PYTHON% if set, else python.
setlocal
if "%~1"=="" goto usage
if "%~2"=="" goto usage
set "N=%~1"
rem N: digits only, no leading 0. With the digits as delimiters, for /f finds a token only if N has
rem anything else (eol=0, not the default ";": a leading 0 is refused anyway). cmd builtins only:
rem Wine's findstr /r has no [...] classes.
set "NONDIGIT="
for /f "eol=0 delims=0123456789" %%c in ("%N%") do set "NONDIGIT=%%c"
if defined NONDIGIT goto usage
if "%N:~0,1%"=="0" goto usage
if not defined PYTHON set "PYTHON=python"
shift
set "REST="
:collect
rem %* ignores shift, so the arguments after N are gathered one by one, keeping their quotes
rem until none is left: an empty argument "" does not end the loop (unquoted set keeps "" as a value)
set ARG=%1
if not defined ARG goto run
set REST=%REST% %1
shift
goto collect
:run
"%PYTHON%" -m pycyxwiz.launch --nproc-per-node %N% %LAUNCH_ARGS% -- %REST%
exit /b %ERRORLEVEL%
:usage
echo usage: %~nx0 N script.py [args...]   (e.g. %~nx0 4 train.py) 1>&2
echo        N: processes to start (an integer ^>= 1); launcher options go in LAUNCH_ARGS 1>&2
exit /b 2
