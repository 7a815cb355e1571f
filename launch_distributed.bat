@echo off
rem Start N ranks of a training script on this machine:
rem   launch_distributed.bat 4 train.py --epochs 3
rem A thin wrapper over "python -m pycyxwiz.launch" (docs\launching.md). Launcher options such as
rem --master-port go in LAUNCH_ARGS; the interpreter is %PYTHON% if set, else python.
setlocal
if "%~1"=="" goto usage
if "%~2"=="" goto usage
set "N=%~1"
echo %N%| findstr /r "^[1-9][0-9]*$" >nul || goto usage
if not defined PYTHON set "PYTHON=python"
shift
set "REST="
:collect
rem %* ignores shift, so the arguments after N are gathered one by one, keeping their quotes
if "%~1"=="" goto run
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
